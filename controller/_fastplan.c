/* A new tree's search, switch entries and messages in C: the layered least-loaded search
 * (trees._spt_vector) and the two per-switch loops of a group's first tree,
 * MulticastCore._fill (controller/core.py) and ofmsgs.tree_adds; and the searches run
 * once per topology: a source switch's DAG (trees._bfs_dag) and a link's detour
 * (protect._path_around).
 *
 * Both loops run once per switch of every new tree (~100 switches, ~300 messages per
 * group on fat-tree:16): in Python they were ~60% of building 1000 trees, the bytecode of
 * a few dict lookups, tuples and byte joins per switch. Here the same steps are done on
 * the same Python objects, in the same order, with the same results; everything computed
 * once per topology or per entry kind (a port's protection piece, a parent link's uplink,
 * an FF group's first user, a group-mod body, a rejoin flow's bytes, a link tag's TLV)
 * stays in Python and is called back on a miss, so this file holds no protection or
 * OpenFlow logic of its own beyond the loops.
 *
 * The tests hold both implementations to the same entries, bookkeeping and bytes
 * (tests/test_controller_fastpath.py); controller.fastplan falls back to the Python
 * ones, with a warning, when this module was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#define IN_PORT_BIT (1L << 15)
#define MAX_PORT (IN_PORT_BIT - 1)
#define FF_BASE 0xFFFF0000L

static PyObject *str_group, *str_output, *str_dpid, *str_wire, *str_xid, *empty;

/* A tuple subclass (SwitchEntry) of four items, as tuple.__new__(cls, (a, b, c, d)) makes it.
 * Its items are an int and tuples of ints, strings and such tuples, made before it: it
 * cannot be part of a reference cycle, so the collector need not visit it. (It never
 * untracks a tuple subclass itself: 10^5 of them for 1000 trees, each young collection
 * visited those made since the last.) */
static PyObject *make_entry(PyTypeObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d) {
    PyObject *e = type->tp_alloc(type, 4);
    if (e == NULL) return NULL;
    Py_INCREF(a);
    Py_INCREF(b);
    Py_INCREF(c);
    Py_INCREF(d);
    PyTuple_SET_ITEM(e, 0, a);
    PyTuple_SET_ITEM(e, 1, b);
    PyTuple_SET_ITEM(e, 2, c);
    PyTuple_SET_ITEM(e, 3, d);
    if (type->tp_dictoffset == 0 && PyLong_CheckExact(a) && PyTuple_CheckExact(b) && PyTuple_CheckExact(c) &&
        PyTuple_CheckExact(d))
        PyObject_GC_UnTrack(e);
    return e;
}

static int get_long(PyObject *o, long *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* ``shapes.setdefault(t, t)`` (stealing t): one tuple object for every equal out-port or
 * FF list, whichever switch and group it is of (a tree holds ~100 of each, mostly the
 * same few); emptied past MAX_SHAPES, as it only saves memory. */
#define MAX_SHAPES (1 << 16)
static PyObject *shape_of(PyObject *shapes, PyObject *t) {
    if (t == NULL || shapes == Py_None || (PyTuple_CheckExact(t) && PyTuple_GET_SIZE(t) == 0))
        return t;  /* (the empty tuple is one object already: most leaves' FF lists) */
    if (PyDict_GET_SIZE(shapes) >= MAX_SHAPES) PyDict_Clear(shapes);
    PyObject *got = PyDict_SetDefault(shapes, t, t);
    Py_XINCREF(got);
    Py_DECREF(t);
    return got;
}

/* The piece of a protected port: () or (first, ff id, in-port ff id, arrival, tag). */
static int piece_ok(PyObject *pc) {
    if (!PyTuple_Check(pc) || (PyTuple_GET_SIZE(pc) != 0 && PyTuple_GET_SIZE(pc) < 5)) {
        PyErr_SetString(PyExc_TypeError, "a protection piece is () or a 5-tuple");
        return 0;
    }
    return 1;
}

/* pc's FF group id for a tree entering on in_port: pc[2] when its detour leaves there. */
static PyObject *piece_ff(PyObject *pc, long in_port, int *err) {
    long first;
    if (get_long(PyTuple_GET_ITEM(pc, 0), &first) < 0) {
        *err = 1;
        return NULL;
    }
    return PyTuple_GET_ITEM(pc, first == in_port ? 2 : 1);
}

/* One user more (step 1) or fewer (-1) of FF group f at switch n (its users: refs), as
 * MulticastCore._count_py counts them: at the first user (or when the last is gone) the
 * protected link's guard is updated unless the port's other FF group is in use (it wants
 * both again), else the switch's want of the group. */
static int count_ff(PyObject *refs, PyObject *f, PyObject *n, long step, PyObject *want_ff, PyObject *guard) {
    long fv;
    if (get_long(f, &fv) < 0) return -1;
    PyObject *old = PyDict_GetItemWithError(refs, f);
    if (old == NULL && PyErr_Occurred()) return -1;
    long c = step;
    if (old != NULL) {
        if (get_long(old, &c) < 0) return -1;
        c += step;
    }
    if (c != 0) {
        PyObject *cv = PyLong_FromLong(c);
        if (cv == NULL || PyDict_SetItem(refs, f, cv) < 0) {
            Py_XDECREF(cv);
            return -1;
        }
        Py_DECREF(cv);
    } else if (PyDict_DelItem(refs, f) < 0) {
        return -1;
    }
    if (c != (step > 0 ? 1 : 0)) return 0;
    PyObject *sib = PyLong_FromLong(fv ^ IN_PORT_BIT), *r;
    if (sib == NULL) return -1;
    int has = PyDict_Contains(refs, sib);
    Py_DECREF(sib);
    if (has < 0) return -1;
    if (has) {  /* (else the link's guard wants both of its port's FF groups again) */
        r = PyObject_CallFunctionObjArgs(want_ff, n, f, NULL);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 0;
    }
    PyObject *port = PyLong_FromLong(fv & MAX_PORT);
    if (port == NULL) return -1;
    PyObject *key = PyTuple_Pack(2, n, port);
    Py_DECREF(port);
    if (key == NULL) return -1;
    r = PyObject_CallFunctionObjArgs(guard, key, step > 0 ? Py_True : Py_False, NULL);
    Py_DECREF(key);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* One user more (step 1) or fewer (-1) of entry e's FF groups at switch n (a rejoin
 * listing outputs may use some). */
static int count_entry(PyObject *e, PyObject *n, long step, PyObject *ff_refs, PyObject *want_ff, PyObject *guard,
                       PyObject *to_own) {
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(e, 2)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(e, 3)) ||
        (PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) != 0 && (PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) != 3 ||
                                                          !PyTuple_Check(PyTuple_GET_ITEM(PyTuple_GET_ITEM(e, 3), 2))))) {
        PyErr_SetString(PyExc_TypeError, "an entry is (in_port, out_ports, ff, rejoin)");
        return -1;
    }
    PyObject *ff = PyTuple_GET_ITEM(e, 2), *rejoin = PyTuple_GET_ITEM(e, 3);
    Py_ssize_t nff = PyTuple_GET_SIZE(ff);
    int listed = PyTuple_GET_SIZE(rejoin) && PyTuple_GET_ITEM(rejoin, 2) != to_own;
    if (!nff && !listed) return 0;
    PyObject *refs = PyObject_GetItem(ff_refs, n);
    if (refs == NULL || !PyDict_Check(refs)) {
        if (refs != NULL) PyErr_SetString(PyExc_TypeError, "ff_refs[n] is a dict");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nff; i++)
        if (count_ff(refs, PyTuple_GET_ITEM(ff, i), n, step, want_ff, guard) < 0) goto fail;
    if (listed) {
        PyObject *acts = PyTuple_GET_ITEM(rejoin, 2);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(acts); i++) {
            PyObject *a = PyTuple_GET_ITEM(acts, i);
            if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) < 2) continue;
            int is_group = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 0), str_group, Py_EQ);
            if (is_group < 0) goto fail;
            if (!is_group || !PyLong_Check(PyTuple_GET_ITEM(a, 1))) continue;
            long f;
            if (get_long(PyTuple_GET_ITEM(a, 1), &f) < 0) goto fail;
            if (f >= FF_BASE && f < FF_BASE + 2 * IN_PORT_BIT &&
                count_ff(refs, PyTuple_GET_ITEM(a, 1), n, step, want_ff, guard) < 0)
                goto fail;
        }
    }
    Py_DECREF(refs);
    return 0;
fail:
    Py_XDECREF(refs);
    return -1;
}

/* (ff, rejoin) of switch n's entry as MulticastCore._protection makes them (ff shaped):
 * new references in *ff_out and *rejoin_out, or -1 with an exception set. */
static int protection_of(PyObject *n, PyObject *in_port, PyObject *out_ports, PyObject *up, PyObject *pieces,
                         PyObject *piece, PyObject *in_port_out, PyObject *shapes, PyObject **ff_out,
                         PyObject **rejoin_out) {
    if (!PyTuple_Check(out_ports) || !PyTuple_Check(up)) {
        PyErr_SetString(PyExc_TypeError, "out_ports and the uplink piece are tuples");
        return -1;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(out_ports), nff = 0;
    PyObject *ff = NULL, *rejoin = NULL, *at = NULL;
    PyObject *stack[16];
    PyObject **pcs = k <= 16 ? stack : PyMem_Malloc(sizeof(PyObject *) * (size_t)k);
    Py_ssize_t got = 0;  /* pcs holding a reference */
    long in_c, arr_c = 0;
    int err = 0, rc = -1;
    if (pcs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (get_long(in_port, &in_c) < 0) goto done;
    at = PyDict_GetItemWithError(pieces, n);
    if (at == NULL) {
        if (PyErr_Occurred()) goto done;
        PyObject *fresh = PyDict_New();
        if (fresh == NULL || PyDict_SetItem(pieces, n, fresh) < 0) {
            Py_XDECREF(fresh);
            goto done;
        }
        at = fresh;  /* (our reference, as below) */
    } else if (!PyDict_Check(at)) {
        PyErr_SetString(PyExc_TypeError, "pieces[n] is a dict");
        at = NULL;
        goto done;
    } else {
        Py_INCREF(at);  /* (a callback could drop it from pieces) */
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *q = PyTuple_GET_ITEM(out_ports, i);
        PyObject *pc = PyDict_GetItemWithError(at, q);
        if (pc != NULL) {
            Py_INCREF(pc);
        } else {
            if (PyErr_Occurred()) goto done;
            pc = PyObject_CallFunctionObjArgs(piece, n, q, NULL);
            if (pc == NULL) goto done;
        }
        pcs[i] = pc;
        got = i + 1;
        if (!piece_ok(pc)) goto done;
        if (PyTuple_GET_SIZE(pc)) nff++;
    }
    ff = PyTuple_New(nff);
    if (ff == NULL) goto done;
    for (Py_ssize_t i = 0, j = 0; i < k; i++) {
        if (!PyTuple_GET_SIZE(pcs[i])) continue;
        PyObject *f = piece_ff(pcs[i], in_c, &err);
        if (err) goto done;
        Py_INCREF(f);
        PyTuple_SET_ITEM(ff, j++, f);
    }
    if (PyTuple_GET_SIZE(up) == 0) {
        rejoin = empty;
        Py_INCREF(rejoin);
    } else {
        if (PyTuple_GET_SIZE(up) < 6 || !PyTuple_Check(PyTuple_GET_ITEM(up, 5))) {
            PyErr_SetString(PyExc_TypeError, "an uplink piece is a 6-tuple ending in its rejoin");
            goto done;
        }
        PyObject *arr = PyTuple_GET_ITEM(up, 3), *link_tag = PyTuple_GET_ITEM(up, 4);
        if (get_long(arr, &arr_c) < 0) goto done;
        Py_ssize_t hit = -1;
        for (Py_ssize_t i = 0; i < k && hit < 0; i++) {
            long q;
            if (get_long(PyTuple_GET_ITEM(out_ports, i), &q) < 0) goto done;
            if (q == arr_c) hit = i;
        }
        if (hit < 0) {  /* into the group's ALL group: the piece's rejoin, shared */
            rejoin = PyTuple_GET_ITEM(up, 5);
            Py_INCREF(rejoin);
        } else {  /* the detour arrives over one of the outputs: each output listed */
            PyObject *acts = PyTuple_New(k);
            if (acts == NULL) goto done;
            for (Py_ssize_t i = 0; i < k; i++) {
                PyObject *a;
                if (i == hit) {
                    a = in_port_out;
                    Py_INCREF(a);
                } else if (PyTuple_GET_SIZE(pcs[i])) {
                    PyObject *f = piece_ff(pcs[i], arr_c, &err);
                    a = err ? NULL : PyTuple_Pack(2, str_group, f);
                } else {
                    a = PyTuple_Pack(2, str_output, PyTuple_GET_ITEM(out_ports, i));
                }
                if (a == NULL) {
                    Py_DECREF(acts);
                    goto done;
                }
                PyTuple_SET_ITEM(acts, i, a);
            }
            rejoin = PyTuple_Pack(3, arr, link_tag, acts);
            Py_DECREF(acts);
        }
        if (rejoin == NULL) goto done;
    }
    ff = shape_of(shapes, ff);
    if (ff == NULL) goto done;
    *ff_out = ff;
    *rejoin_out = rejoin;
    ff = rejoin = NULL;
    rc = 0;
done:
    for (Py_ssize_t i = 0; i < got; i++) Py_DECREF(pcs[i]);
    if (pcs != stack) PyMem_Free(pcs);
    Py_XDECREF(ff);
    Py_XDECREF(rejoin);
    Py_XDECREF(at);
    return rc;
}

/* One switch of a protected entry (protection_of), the FF users counted as _fill counts
 * them. Returns the entry (new reference). */
static PyObject *protected_entry(PyObject *n, PyObject *in_port, PyObject *out_ports, PyObject *up,
                                 PyObject *pieces, PyObject *piece, PyObject *ff_refs, PyObject *want_ff,
                                 PyObject *guard, PyObject *to_own, PyTypeObject *entry_type,
                                 PyObject *in_port_out, PyObject *shapes) {
    PyObject *ff, *rejoin;
    if (protection_of(n, in_port, out_ports, up, pieces, piece, in_port_out, shapes, &ff, &rejoin) < 0)
        return NULL;
    PyObject *result = make_entry(entry_type, in_port, out_ports, ff, rejoin);
    Py_DECREF(ff);
    Py_DECREF(rejoin);
    if (result != NULL && count_entry(result, n, 1, ff_refs, want_ff, guard, to_own) < 0) Py_CLEAR(result);
    return result;
}

/* count(entries, step, ff_refs, want_ff, guard, to_own): MulticastCore._count_py's loop
 * (see there). */
static PyObject *count(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "count(entries: dict, step, ff_refs, want_ff, guard, to_own)");
        return NULL;
    }
    long step;
    if (get_long(args[1], &step) < 0) return NULL;
    if (step != 1 && step != -1) {
        PyErr_SetString(PyExc_ValueError, "count: step is 1 or -1");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *n, *e;
    while (PyDict_Next(args[0], &pos, &n, &e)) {
        Py_INCREF(e);  /* (callbacks run) */
        int rc = count_entry(e, n, step, args[2], args[3], args[4], args[5]);
        Py_DECREF(e);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* uplinks[n][par], or uplink(n, par) on a miss (MulticastCore._uplink): (n's port towards
 * par, the piece of par's port towards n). New reference. */
static PyObject *uplink_of(PyObject *uplinks, PyObject *uplink, PyObject *n, PyObject *par) {
    PyObject *u = NULL, *at = PyDict_GetItemWithError(uplinks, n);
    if (at != NULL) {
        u = PyDict_Check(at) ? PyDict_GetItemWithError(at, par) : NULL;
        Py_XINCREF(u);
    }
    if (u == NULL && (PyErr_Occurred() || (u = PyObject_CallFunctionObjArgs(uplink, n, par, NULL)) == NULL))
        return NULL;
    if (!PyTuple_Check(u) || PyTuple_GET_SIZE(u) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(u, 1))) {
        PyErr_SetString(PyExc_TypeError, "an uplink is (in_port, piece)");
        Py_DECREF(u);
        return NULL;
    }
    return u;
}

/* The FF groups entry e uses (borrowed): its buckets', then those its rejoin lists (as
 * count_entry counts them); at most cap, else -1 with an error. */
static Py_ssize_t counted_ids(PyObject *e, PyObject *to_own, PyObject **out, long *vals, Py_ssize_t cap) {
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(e, 2)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(e, 3))) {
        PyErr_SetString(PyExc_TypeError, "an entry is (in_port, out_ports, ff, rejoin)");
        return -1;
    }
    PyObject *ff = PyTuple_GET_ITEM(e, 2), *rejoin = PyTuple_GET_ITEM(e, 3);
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ff); i++) {
        if (k == cap) goto full;
        out[k] = PyTuple_GET_ITEM(ff, i);
        if (get_long(out[k], &vals[k]) < 0) return -1;
        k++;
    }
    if (PyTuple_GET_SIZE(rejoin) == 3 && PyTuple_GET_ITEM(rejoin, 2) != to_own && PyTuple_Check(PyTuple_GET_ITEM(rejoin, 2))) {
        PyObject *acts = PyTuple_GET_ITEM(rejoin, 2);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(acts); i++) {
            PyObject *a = PyTuple_GET_ITEM(acts, i);
            if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) < 2 || !PyLong_Check(PyTuple_GET_ITEM(a, 1))) continue;
            int is_group = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 0), str_group, Py_EQ);
            if (is_group < 0) return -1;
            long f;
            if (!is_group || get_long(PyTuple_GET_ITEM(a, 1), &f) < 0) {
                if (PyErr_Occurred()) return -1;
                continue;
            }
            if (f < FF_BASE || f >= FF_BASE + 2 * IN_PORT_BIT) continue;
            if (k == cap) goto full;
            out[k] = PyTuple_GET_ITEM(a, 1);
            vals[k++] = f;
        }
    } else if (PyTuple_GET_SIZE(rejoin) != 0 && PyTuple_GET_SIZE(rejoin) != 3) {
        PyErr_SetString(PyExc_TypeError, "an entry's rejoin is () or (arrival, tag, actions)");
        return -1;
    }
    return k;
full:
    PyErr_SetString(PyExc_ValueError, "recount: an entry with too many FF groups");
    return -1;
}

#define MAX_IDS 512
/* The users of the FF groups in a (n ids) but not in b (a multiset difference), counted
 * by step at switch n, in a's order. */
static int count_difference(PyObject *const *a, const long *av, Py_ssize_t na, const long *bv, Py_ssize_t nb,
                            PyObject *n, long step, PyObject *refs, PyObject *want_ff, PyObject *guard) {
    char used[MAX_IDS] = {0};
    for (Py_ssize_t i = 0; i < na; i++) {
        Py_ssize_t j = 0;
        while (j < nb && (used[j] || bv[j] != av[i])) j++;
        if (j < nb) {
            used[j] = 1;
            continue;
        }
        if (count_ff(refs, a[i], n, step, want_ff, guard) < 0) return -1;
    }
    return 0;
}

/* Switch n's entry from o to e (they differ): the users of the FF groups o uses and e
 * does not taken off (step -1), or of those e uses and o does not added (step 1). */
static int count_changed(PyObject *o, PyObject *e, PyObject *n, long step, PyObject *ff_refs, PyObject *want_ff,
                         PyObject *guard, PyObject *to_own) {
    PyObject *a[MAX_IDS], *b[MAX_IDS];
    long av[MAX_IDS], bv[MAX_IDS];
    Py_ssize_t na = counted_ids(o, to_own, a, av, MAX_IDS), nb = na < 0 ? -1 : counted_ids(e, to_own, b, bv, MAX_IDS);
    if (nb < 0) return -1;
    if (!na && !nb) return 0;
    PyObject *refs = PyObject_GetItem(ff_refs, n);
    if (refs == NULL || !PyDict_Check(refs)) {
        if (refs != NULL) PyErr_SetString(PyExc_TypeError, "ff_refs[n] is a dict");
        Py_XDECREF(refs);
        return -1;
    }
    int rc = step < 0 ? count_difference(a, av, na, bv, nb, n, -1, refs, want_ff, guard)
                      : count_difference(b, bv, nb, av, na, n, 1, refs, want_ff, guard);
    Py_DECREF(refs);
    return rc;
}

/* recount(was, now, ff_refs, want_ff, guard, to_own): MulticastCore._recount_py (see
 * there): the users taken off for every entry of was that now lacks or differs from, then
 * added for every entry of now that was lacks or differs from; at a switch in both only
 * the FF groups one uses and the other does not. */
static PyObject *recount(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "recount(was: dict, now: dict, ff_refs, want_ff, guard, to_own)");
        return NULL;
    }
    PyObject *was = args[0], *now = args[1], *ff_refs = args[2], *want_ff = args[3], *guard = args[4],
             *to_own = args[5], *n, *e;
    for (int pass = 0; pass < 3; pass++) {  /* off; then on where both differ; then on where new */
        Py_ssize_t pos = 0;
        while (PyDict_Next(pass < 2 ? was : now, &pos, &n, &e)) {
            PyObject *o = PyDict_GetItemWithError(pass < 2 ? now : was, n);
            if (o == NULL && PyErr_Occurred()) return NULL;
            if (pass == 2) {
                if (o == NULL) {
                    Py_INCREF(e);  /* (callbacks run) */
                    int rc = count_entry(e, n, 1, ff_refs, want_ff, guard, to_own);
                    Py_DECREF(e);
                    if (rc < 0) return NULL;
                }
                continue;
            }
            if (o == NULL) {
                if (pass == 0) {
                    Py_INCREF(e);
                    int rc = count_entry(e, n, -1, ff_refs, want_ff, guard, to_own);
                    Py_DECREF(e);
                    if (rc < 0) return NULL;
                }
                continue;
            }
            Py_INCREF(e);
            Py_INCREF(o);
            int same = PyObject_RichCompareBool(o, e, Py_EQ);
            int rc = same < 0 ? -1 : same ? 0 : count_changed(e, o, n, pass == 0 ? -1 : 1, ff_refs, want_ff, guard, to_own);
            Py_DECREF(e);
            Py_DECREF(o);
            if (rc < 0) return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* fill(entries, parent, outs, source_port, uplinks, uplink, protect, pieces, piece,
 *      ff_refs, want_ff, guard, to_own, entry_type, in_port_out, shapes)
 * MulticastCore._fill's loop: see there. */
/* What fill and fill_tree are given besides the tree (see MulticastCore._fill_py). */
typedef struct {
    PyObject *source_port, *uplinks, *uplink, *pieces, *piece, *ff_refs, *want_ff, *guard, *to_own, *in_port_out,
        *shapes;
    PyTypeObject *entry_type;
    int protect;
} Filling;

/* fill's arguments from source_port on (args[0..12]: source_port, uplinks, uplink, protect,
 * pieces, piece, ff_refs, want_ff, guard, to_own, entry_type, in_port_out, shapes). */
static int filling_of(PyObject *const *args, Filling *f) {
    f->source_port = args[0], f->uplinks = args[1], f->uplink = args[2], f->pieces = args[4], f->piece = args[5];
    f->ff_refs = args[6], f->want_ff = args[7], f->guard = args[8], f->to_own = args[9];
    f->in_port_out = args[11], f->shapes = args[12];
    f->protect = PyObject_IsTrue(args[3]);
    if (f->protect < 0) return -1;
    if (!PyDict_Check(f->uplinks) || !PyDict_Check(f->pieces) || !PyType_Check(args[10]) ||
        !PyType_IsSubtype((PyTypeObject *)args[10], &PyTuple_Type) || (f->shapes != Py_None && !PyDict_Check(f->shapes))) {
        PyErr_SetString(PyExc_TypeError, "fill: uplinks and pieces are dicts, entry_type a tuple type, "
                                         "shapes a dict or None");
        return -1;
    }
    f->entry_type = (PyTypeObject *)args[10];
    return 0;
}

/* Switch n's entry into entries: its parent par, its output ports ports (a tuple, sorted;
 * stolen: shaped here), as MulticastCore._fill_py makes it. */
static int fill_one(const Filling *f, PyObject *entries, PyObject *n, PyObject *par, PyObject *ports) {
    PyObject *out_ports = shape_of(f->shapes, ports);
    if (out_ports == NULL) return -1;
    PyObject *in_port, *up, *u = NULL;
    if (par == Py_None) {
        in_port = f->source_port;
        up = empty;
    } else {
        u = uplink_of(f->uplinks, f->uplink, n, par);
        if (u == NULL) {
            Py_DECREF(out_ports);
            return -1;
        }
        in_port = PyTuple_GET_ITEM(u, 0);
        up = PyTuple_GET_ITEM(u, 1);
    }
    PyObject *entry = f->protect ? protected_entry(n, in_port, out_ports, up, f->pieces, f->piece, f->ff_refs,
                                                   f->want_ff, f->guard, f->to_own, f->entry_type, f->in_port_out,
                                                   f->shapes)
                                 : make_entry(f->entry_type, in_port, out_ports, empty, empty);
    Py_XDECREF(u);  /* (the uplinks dict keeps in_port and up alive) */
    Py_DECREF(out_ports);
    if (entry == NULL) return -1;
    int rc = PyDict_SetItem(entries, n, entry);
    Py_DECREF(entry);
    return rc;
}

/* fill's loop: each switch of outs (switch -> its output ports, a list, sorted here). */
static int fill_from_outs(const Filling *f, PyObject *entries, PyObject *parent, PyObject *outs) {
    Py_ssize_t pos = 0;
    PyObject *n, *ports;
    while (PyDict_Next(outs, &pos, &n, &ports)) {
        PyObject *par = PyDict_GetItemWithError(parent, n);
        if (par == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            return -1;
        }
        if (!PyList_Check(ports) || PyList_Sort(ports) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "fill: outs holds lists");
            return -1;
        }
        PyObject *t = PyList_AsTuple(ports);
        if (t == NULL || fill_one(f, entries, n, par, t) < 0) return -1;
    }
    return 0;
}

/* fill(entries, parent, outs, source_port, uplinks, uplink, protect, pieces, piece, ff_refs,
 *      want_ff, guard, to_own, entry_type, in_port_out, shapes): MulticastCore._fill_py's
 * loop (see there), each switch's output ports given (outs). */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "fill takes 16 arguments");
        return NULL;
    }
    Filling f;
    if (filling_of(args + 3, &f) < 0) return NULL;
    if (!PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fill: entries, parent and outs are dicts");
        return NULL;
    }
    if (fill_from_outs(&f, args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* protect(entries, parent, nodes, was, was_parent, at, stale, touches, uplinks, uplink, pieces,
 *         piece, entry_type, in_port_out, shapes)
 * MulticastCore._protect_py's loop (see there): each switch of nodes (None: of entries)
 * keeps its entry of the old tree (was) where its ports and parent are the same and no
 * detour of theirs is stale (touches(n, par, out_ports, stale) asked only when n or par
 * is in at), else gets its protection (protection_of) and a new entry if that differs. */
/* The arguments protect and reprotect share (see protect). */
typedef struct {
    PyObject *at, *stale, *touches, *uplinks, *uplink, *pieces, *piece, *in_port_out, *shapes;
    PyTypeObject *entry_type;
} Protecting;

static int protecting_ok(const Protecting *pr) {
    if (!PyAnySet_Check(pr->at) || !PyDict_Check(pr->uplinks) || !PyDict_Check(pr->pieces) ||
        (pr->shapes != Py_None && !PyDict_Check(pr->shapes))) {
        PyErr_SetString(PyExc_TypeError, "protect: uplinks and pieces are dicts, at a set, shapes a dict or None");
        return 0;
    }
    return 1;
}

static int protect_tree(PyObject *entries, PyObject *parent, PyObject *nodes, PyObject *was, PyObject *was_parent,
                        const Protecting *pr);

static PyObject *protect(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "protect takes 15 arguments");
        return NULL;
    }
    if (!PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[3]) || !PyDict_Check(args[4]) ||
        !PyType_Check(args[12]) || !PyType_IsSubtype((PyTypeObject *)args[12], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "protect: entries, parent, was and was_parent are dicts, entry_type a "
                                         "tuple type");
        return NULL;
    }
    Protecting pr = {args[5], args[6], args[7], args[8], args[9], args[10], args[11], args[13], args[14],
                     (PyTypeObject *)args[12]};
    if (!protecting_ok(&pr) || protect_tree(args[0], args[1], args[2], args[3], args[4], &pr) < 0) return NULL;
    Py_RETURN_NONE;
}

/* protect's loop over one tree (0, or -1 with an error set). */
static int protect_tree(PyObject *entries, PyObject *parent, PyObject *nodes, PyObject *was, PyObject *was_parent,
                        const Protecting *pr) {
    PyObject *at = pr->at, *stale = pr->stale, *touches = pr->touches, *uplinks = pr->uplinks, *uplink = pr->uplink,
             *pieces = pr->pieces, *piece = pr->piece, *in_port_out = pr->in_port_out, *shapes = pr->shapes;
    PyTypeObject *entry_type = pr->entry_type;
    PyObject *it = nodes == Py_None ? NULL : PyObject_GetIter(nodes), *keys = NULL;
    if (nodes == Py_None) {
        keys = PyDict_Keys(entries);  /* (entries are replaced while walked) */
        if (keys == NULL) return -1;
        it = PyObject_GetIter(keys);
    }
    if (it == NULL) {
        Py_XDECREF(keys);
        return -1;
    }
    PyObject *n;
    while ((n = PyIter_Next(it)) != NULL) {
        PyObject *e = PyDict_GetItemWithError(entries, n), *par = NULL, *ff = NULL, *rejoin = NULL, *u = NULL;
        int rc = -1;
        if (e == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            goto next;
        }
        Py_INCREF(e);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_SetString(PyExc_TypeError, "an entry is (in_port, out_ports, ff, rejoin)");
            goto next;
        }
        PyObject *in_port = PyTuple_GET_ITEM(e, 0), *out_ports = PyTuple_GET_ITEM(e, 1);
        par = PyDict_GetItemWithError(parent, n);
        if (par == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            goto next;
        }
        Py_INCREF(par);
        PyObject *o = PyDict_GetItemWithError(was, n);
        if (o == NULL && PyErr_Occurred()) goto next;
        if (o != NULL && PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 4) {
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(o, 0), in_port, Py_EQ);
            if (same > 0) same = PyObject_RichCompareBool(PyTuple_GET_ITEM(o, 1), out_ports, Py_EQ);
            if (same > 0) {
                PyObject *wp = PyDict_GetItemWithError(was_parent, n);
                if (wp == NULL)
                    same = PyErr_Occurred() ? -1 : 0;
                else
                    same = PyObject_RichCompareBool(wp, par, Py_EQ);
            }
            if (same > 0) {  /* unless a detour of its ports or parent link is stale */
                int near = PySet_Contains(at, n);
                if (near == 0) near = PySet_Contains(at, par);
                if (near < 0) goto next;
                if (near) {
                    PyObject *r = PyObject_CallFunctionObjArgs(touches, n, par, out_ports, stale, NULL);
                    if (r == NULL) goto next;
                    int t = PyObject_IsTrue(r);
                    Py_DECREF(r);
                    if (t < 0) goto next;
                    same = !t;
                }
            }
            if (same < 0) goto next;
            if (same) {
                rc = o == e ? 0 : PyDict_SetItem(entries, n, o);
                goto next;
            }
        }
        PyObject *up = empty;
        if (par != Py_None) {
            u = uplink_of(uplinks, uplink, n, par);
            if (u == NULL) goto next;
            up = PyTuple_GET_ITEM(u, 1);
        }
        if (protection_of(n, in_port, out_ports, up, pieces, piece, in_port_out, Py_None, &ff, &rejoin) < 0)
            goto next;
        int same = PyObject_RichCompareBool(ff, PyTuple_GET_ITEM(e, 2), Py_EQ);
        if (same > 0) same = PyObject_RichCompareBool(rejoin, PyTuple_GET_ITEM(e, 3), Py_EQ);
        if (same < 0) goto next;
        if (same) {
            rc = 0;
            goto next;
        }
        ff = shape_of(shapes, ff);  /* (shaped only when kept: an unchanged entry keeps its own) */
        if (ff == NULL) goto next;
        PyObject *fresh = make_entry(entry_type, in_port, out_ports, ff, rejoin);
        if (fresh == NULL) goto next;
        rc = PyDict_SetItem(entries, n, fresh);
        Py_DECREF(fresh);
    next:
        Py_XDECREF(ff);
        Py_XDECREF(rejoin);
        Py_XDECREF(u);
        Py_XDECREF(par);
        Py_XDECREF(e);
        Py_DECREF(n);
        if (rc < 0) {
            Py_DECREF(it);
            Py_XDECREF(keys);
            return -1;
        }
    }
    Py_DECREF(it);
    Py_XDECREF(keys);
    return PyErr_Occurred() ? -1 : 0;
}

/* reprotect(items, stale, touches, uplinks, uplink, pieces, piece, entry_type, in_port_out,
 *           shapes, ff_refs, want_ff, guard, to_own) -> [gid, ...]
 * MulticastCore._reprotect_py's loop (see there): for each (gid, entries, parent, at) of
 * items, the switches of at protected anew (protect_tree, no old tree); where an entry
 * changed, the FF users of the changed ones recounted (recount's difference: every one
 * taken off, then every one added); the gids with a change, in items' order. */
static PyObject *reprotect(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14 || !PyList_Check(args[0]) || !PyType_Check(args[7]) ||
        !PyType_IsSubtype((PyTypeObject *)args[7], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "reprotect(items: list, stale, touches, uplinks, uplink, pieces, piece, "
                                         "entry_type, in_port_out, shapes, ff_refs, want_ff, guard, to_own)");
        return NULL;
    }
    PyObject *items = args[0], *ff_refs = args[10], *want_ff = args[11], *guard = args[12], *to_own = args[13];
    PyObject *near = PySet_New(NULL), *none = PyDict_New(), *kept = PyList_New(0), *olds = NULL;
    Protecting pr = {near, args[1], args[2], args[3], args[4], args[5], args[6], args[8], args[9],
                     (PyTypeObject *)args[7]};
    if (near == NULL || none == NULL || kept == NULL || !protecting_ok(&pr)) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4 || !PyDict_Check(PyTuple_GET_ITEM(item, 1)) ||
            !PyDict_Check(PyTuple_GET_ITEM(item, 2)) || !PyAnySet_Check(PyTuple_GET_ITEM(item, 3))) {
            PyErr_SetString(PyExc_TypeError, "reprotect: items are (gid, entries: dict, parent: dict, at: set)");
            goto fail;
        }
        PyObject *gid = PyTuple_GET_ITEM(item, 0), *entries = PyTuple_GET_ITEM(item, 1),
                 *parent = PyTuple_GET_ITEM(item, 2), *at = PyTuple_GET_ITEM(item, 3);
        /* (switch, its entry before) for the switches of at, in at's order */
        Py_XSETREF(olds, PyList_New(0));
        if (olds == NULL) goto fail;
        PyObject *it = PyObject_GetIter(at), *n;
        if (it == NULL) goto fail;
        while ((n = PyIter_Next(it)) != NULL) {
            PyObject *e = PyDict_GetItemWithError(entries, n), *pair = NULL;
            if (e == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            } else {
                pair = PyTuple_Pack(2, n, e);
            }
            Py_DECREF(n);
            if (pair == NULL || PyList_Append(olds, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(it);
                goto fail;
            }
            Py_DECREF(pair);
        }
        Py_DECREF(it);
        if (PyErr_Occurred() || protect_tree(entries, parent, at, none, none, &pr) < 0) goto fail;
        int moved = 0;
        for (int pass = 0; pass < 2; pass++) {  /* every changed entry's users off, then on */
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(olds); j++) {
                PyObject *n2 = PyTuple_GET_ITEM(PyList_GET_ITEM(olds, j), 0),
                         *o = PyTuple_GET_ITEM(PyList_GET_ITEM(olds, j), 1), *e = PyDict_GetItemWithError(entries, n2);
                if (e == NULL) {
                    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n2);
                    goto fail;
                }
                if (e == o) continue;  /* (protect_tree keeps an entry whose protection is the same) */
                moved = 1;
                Py_INCREF(e);
                int rc = count_changed(o, e, n2, pass == 0 ? -1 : 1, ff_refs, want_ff, guard, to_own);
                Py_DECREF(e);
                if (rc < 0) goto fail;
            }
            if (!moved) break;
        }
        if (moved && PyList_Append(kept, gid) < 0) goto fail;
    }
    Py_XDECREF(olds);
    Py_DECREF(near);
    Py_DECREF(none);
    return kept;
fail:
    Py_XDECREF(olds);
    Py_XDECREF(near);
    Py_XDECREF(none);
    Py_XDECREF(kept);
    return NULL;
}

/* bytes a + b + c (+ d) */
static PyObject *join4(PyObject *a, const char *b, Py_ssize_t nb, PyObject *c, PyObject *d) {
    Py_ssize_t na = PyBytes_GET_SIZE(a), nc = PyBytes_GET_SIZE(c), nd = d ? PyBytes_GET_SIZE(d) : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, na + nb + nc + nd);
    if (out == NULL) return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, PyBytes_AS_STRING(a), (size_t)na);
    memcpy(p + na, b, (size_t)nb);
    memcpy(p + na + nb, PyBytes_AS_STRING(c), (size_t)nc);
    if (d) memcpy(p + na + nb + nc, PyBytes_AS_STRING(d), (size_t)nd);
    return out;
}

static int be32_of(PyObject *o, char out[4]) {
    long v;
    if (get_long(o, &v) < 0) return -1;
    if (v < 0 || v > 0xFFFFFFFFL) {
        PyErr_SetString(PyExc_OverflowError, "a port or group id is 32 bits");
        return -1;
    }
    out[0] = (char)(v >> 24);
    out[1] = (char)(v >> 16);
    out[2] = (char)(v >> 8);
    out[3] = (char)v;
    return 0;
}

/* Where a Ready message class keeps ``_dpid``, ``_wire`` and ``xid``: its slots. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t dpid_at, wire_at, xid_at;
} Slots;

static int slot_offset(PyObject *cls, PyObject *name, Py_ssize_t *at) {
    PyObject *d = PyObject_GetAttr(cls, name);
    if (d == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%R has no slot %U: not a ready message class", cls, name);
        }
        return -1;
    }
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok) *at = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) PyErr_Format(PyExc_TypeError, "%R: %U is not an object slot", cls, name);
    return ok ? 0 : -1;
}

static int slots_of(PyObject *cls, Slots *s) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "a message class is a type");
        return -1;
    }
    s->type = (PyTypeObject *)cls;
    return slot_offset(cls, str_dpid, &s->dpid_at) < 0 || slot_offset(cls, str_wire, &s->wire_at) < 0
        || slot_offset(cls, str_xid, &s->xid_at) < 0 ? -1 : 0;
}

/* (dpid, message): a message of class s (as object.__new__ makes it) whose wire is wire
 * (stolen), its xid None until sent. Neither the message
 * nor the pair can be part of a reference cycle (an int, bytes, and later only what is
 * decoded from the bytes): the collector need not visit the ~300 of each that a new
 * tree's plan holds while it is alive. New reference. */
static PyObject *ready_pair(const Slots *s, PyObject *dpid, PyObject *wire) {
    if (wire == NULL) return NULL;
    PyObject *m = s->type->tp_alloc(s->type, 0);
    if (m == NULL) {
        Py_DECREF(wire);
        return NULL;
    }
    Py_INCREF(dpid);
    *(PyObject **)((char *)m + s->dpid_at) = dpid;
    *(PyObject **)((char *)m + s->wire_at) = wire;  /* (the reference given) */
    Py_INCREF(Py_None);  /* (not sent yet: ``send_msg`` asks for it) */
    *(PyObject **)((char *)m + s->xid_at) = Py_None;
    PyObject_GC_UnTrack(m);
    PyObject *pair = PyTuple_Pack(2, dpid, m);
    Py_DECREF(m);
    if (pair != NULL) PyObject_GC_UnTrack(pair);
    return pair;
}

static int add_msg(PyObject *out, const Slots *s, PyObject *dpid, PyObject *wire, Py_ssize_t *at) {
    PyObject *pair = ready_pair(s, dpid, wire);
    if (pair == NULL) return -1;
    if (*at >= PyList_GET_SIZE(out)) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_RuntimeError, "tree_adds: more messages than counted");
        return -1;
    }
    PyList_SET_ITEM(out, (*at)++, pair);
    return 0;
}

static inline void put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void put32(unsigned char *p, unsigned long v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

#define OFP_VERSION 4
#define OFPT_GROUP_MOD 15
#define OFPGC_ADD 0
#define OFPAT_OUTPUT 0
#define OFPAT_GROUP 22
#define OFPP_IN_PORT 0xfffffff8UL
#define OFPP_ANY 0xffffffffUL
#define OFPG_ANY 0xffffffffUL
#define MAX_BUCKETS 4096

/* An ALL group add (OFPGC_ADD, OFPGT_ALL, xid 0) of group ``gid`` for an entry's
 * in_port, sorted out_ports and FF ids, as ofmsgs.buckets packs it: one bucket per
 * output (watch port and group ANY), through the port's FF group when one protects
 * it (the last FF id of a port wins, as the dict there), else OFPP_IN_PORT for the
 * ingress port, else the port. */
/* A group-mod of an ALL group (command ``command``): a bucket per output port, through
 * its FF group where ``ff`` has one for the port (the last for it), OFPP_IN_PORT for
 * the ingress port itself; ofmsgs.buckets's bytes. ``out_ports`` must be in order
 * (an entry's are) unless ``sort``, when they are put in order here as buckets sorts them. */
static PyObject *group_wire(unsigned command, unsigned long gid, PyObject *in_port, PyObject *out_ports,
                            PyObject *ff, int sort) {
    if (!PyTuple_Check(out_ports) || !PyTuple_Check(ff)) {
        PyErr_SetString(PyExc_TypeError, "an entry's out_ports and ff are tuples");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(out_ports), nf = PyTuple_GET_SIZE(ff);
    if (k > MAX_BUCKETS) {
        PyErr_SetString(PyExc_ValueError, "too many buckets for one group");
        return NULL;
    }
    long in_c;
    if (get_long(in_port, &in_c) < 0) return NULL;
    unsigned long ports[64], *port = ports, *via = NULL;
    unsigned long vias[64];
    if (k > 64) {
        port = PyMem_Malloc(sizeof(unsigned long) * 2 * (size_t)k);
        if (port == NULL) return PyErr_NoMemory();
        via = port + k;
    } else {
        via = vias;
    }
    PyObject *wire = NULL;
    Py_ssize_t size = 16;
    for (Py_ssize_t i = 0; i < k; i++) {
        long q;
        if (get_long(PyTuple_GET_ITEM(out_ports, i), &q) < 0) goto done;
        if (q < 0 || (unsigned long)q > 0xffffffffUL || (!sort && i > 0 && (unsigned long)q <= port[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "out_ports are distinct 32-bit ports in order");
            goto done;
        }
        Py_ssize_t at = i;  /* (in order already, unless sort: insertion) */
        for (; at > 0 && port[at - 1] > (unsigned long)q; at--) {
            port[at] = port[at - 1];
            via[at] = via[at - 1];
        }
        port[at] = (unsigned long)q;
        via[at] = 0;
        for (Py_ssize_t j = 0; j < nf; j++) {  /* (a few ids: the last for the port wins) */
            long f;
            if (get_long(PyTuple_GET_ITEM(ff, j), &f) < 0) goto done;
            if (f < 0 || (unsigned long)f > 0xffffffffUL) {
                PyErr_SetString(PyExc_ValueError, "an FF group id is 32 bits");
                goto done;
            }
            if ((f & MAX_PORT) == q) via[at] = (unsigned long)f;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) size += via[i] ? 24 : 32;
    if (size > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "a group-mod longer than 64 KB");
        goto done;
    }
    wire = PyBytes_FromStringAndSize(NULL, size);
    if (wire == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(wire);
    memset(p, 0, (size_t)size);
    p[0] = OFP_VERSION;
    p[1] = OFPT_GROUP_MOD;
    put16(p + 2, (unsigned)size);  /* xid 0 */
    put16(p + 8, command);  /* type ALL (0), pad */
    put32(p + 12, gid);
    p += 16;
    for (Py_ssize_t i = 0; i < k; i++) {
        unsigned blen = via[i] ? 24 : 32;
        put16(p, blen);  /* weight 0 */
        put32(p + 4, OFPP_ANY);
        put32(p + 8, OFPG_ANY);
        if (via[i]) {
            put16(p + 16, OFPAT_GROUP);
            put16(p + 18, 8);
            put32(p + 20, via[i]);
        } else {  /* OFPAT_OUTPUT (0), max_len 0, pad */
            put16(p + 18, 16);
            put32(p + 20, (long)port[i] == in_c ? OFPP_IN_PORT : port[i]);
        }
        p += blen;
    }
done:
    if (port != ports) PyMem_Free(port);
    return wire;
}

/* group_mod(command, gid, in_port, out_ports, ff) -> bytes: ofmsgs._group_mod's ALL group
 * (see group_wire), out_ports and ff as tuples in any order. */
static PyObject *group_mod(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "group_mod(command, gid, in_port, out_ports, ff)");
        return NULL;
    }
    long command, gid;
    if (get_long(args[0], &command) < 0 || get_long(args[1], &gid) < 0) return NULL;
    if (command < 0 || command > 0xffff || gid < 0 || gid > 0xFFFFFFFFL) {
        PyErr_SetString(PyExc_OverflowError, "a command is 16 bits and a group id 32");
        return NULL;
    }
    return group_wire((unsigned)command, (unsigned long)gid, args[2], args[3], args[4], 1);
}

static int pair_of_bytes(PyObject *t) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(t, 1))) {
        PyErr_SetString(PyExc_TypeError, "expected (bytes, bytes)");
        return 0;
    }
    return 1;
}

/* A link tag's TLV for a tag of the form aa:bb:cc:dd:ee:ff (an ASCII str, lower- or
 * upper-case hex) into out: eth_dst's OXM header (0x80000606, ofmsgs._OXM_ETH_DST), then
 * the 6 bytes, as ofmsgs._tag_oxm makes it. 1 when written, 0 for any other object.
 * Read off the tag each time rather than kept: ~100,000 rejoin flows per 1000 new trees
 * on fat-tree:16, and a dict of their TLVs (ofmsgs.TAGS, ~600 KB with its keys) missed
 * the cache 2-3 times per flow, ~4% of the build. */
static int mac_tlv_into(PyObject *link_tag, char out[10]) {
    if (!PyUnicode_Check(link_tag) || !PyUnicode_IS_COMPACT_ASCII(link_tag) || PyUnicode_GET_LENGTH(link_tag) != 17)
        return 0;
    const char *t = (const char *)PyUnicode_DATA(link_tag);
    unsigned char mac[6];
    for (int i = 0; i < 6; i++) {
        int hi, lo;
        char c = t[3 * i], d = t[3 * i + 1];
        if (i < 5 && t[3 * i + 2] != ':') return 0;
        hi = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        lo = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
        if (hi < 0 || lo < 0) return 0;
        mac[i] = (unsigned char)(hi << 4 | lo);
    }
    out[0] = (char)0x80, out[1] = 0x00, out[2] = 0x06, out[3] = 0x06;
    memcpy(out + 4, mac, 6);
    return 1;
}

/* A rejoin's (arrival, tag, actions) match as packed after its flow's head: the arrival
 * port (4 bytes, big-endian), then the tag's TLV (10) -- made here (mac_tlv_into) or,
 * for a tag of another form, tags[tag] or make_tag(tag) (ofmsgs.tag_tlv, which refuses
 * what is no MAC address). */
static int rejoin_match(PyObject *tags, PyObject *make_tag, PyObject *rejoin, char out[14]) {
    PyObject *link_tag = PyTuple_GET_ITEM(rejoin, 1);
    if (!mac_tlv_into(link_tag, out + 4)) {
        PyObject *tlv = PyDict_GetItemWithError(tags, link_tag);
        if (tlv != NULL) {
            Py_INCREF(tlv);
        } else if (!PyErr_Occurred()) {
            tlv = PyObject_CallOneArg(make_tag, link_tag);
        }
        if (tlv == NULL) return -1;
        if (!PyBytes_Check(tlv) || PyBytes_GET_SIZE(tlv) != 10) {
            PyErr_SetString(PyExc_TypeError, "a tag's TLV is 10 bytes");
            Py_DECREF(tlv);
            return -1;
        }
        memcpy(out + 4, PyBytes_AS_STRING(tlv), 10);
        Py_DECREF(tlv);
    }
    return be32_of(PyTuple_GET_ITEM(rejoin, 0), out);
}

/* -- a group's rejoin flows: their bytes around the arrival port and tag -------------
 * ofmsgs._rejoin_flow makes them, one Python call per action list: ~5 per new tree and
 * ~30,000 instructions each, a third of tree_adds. A group's rejoin flows differ only in
 * the kept actions at the end of the instruction (after the one restoring the group's
 * MAC), so once Python has made one, the others are packed here from it: its head with
 * the new length, its tail up to the instruction, its MAC action, then these actions.
 * The first pair is checked to be of that layout (its actions packed here must be its
 * last bytes); an action list this does not pack is Python's, as is every one after a
 * first pair of another layout. */
#define OFPIT_APPLY_ACTIONS 4
#define OFPAT_SET_FIELD 25
#define OWN_GROUP (-1L)
#define MAX_KEPT 64

typedef struct {
    PyObject *make;  /* rejoin_flow(acts) -> (head, tail) (borrowed) */
    unsigned long gid;
    int state;  /* 0: no pair yet; 1: head, prefix and mac hold; -1: Python makes each */
    PyObject *head, *prefix, *mac;  /* (owned) */
} Rejoins;

static void rejoins_clear(Rejoins *r) {
    Py_CLEAR(r->head);
    Py_CLEAR(r->prefix);
    Py_CLEAR(r->mac);
}

static inline unsigned get16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The kept actions ``acts`` as ofmsgs._actions packs them after rejoin_actions (OWN_GROUP
 * as the group): their length in out, or -1 for a form not packed here (no error set). */
static Py_ssize_t pack_kept(PyObject *acts, unsigned long gid, unsigned char *out) {
    if (!PyTuple_Check(acts) || PyTuple_GET_SIZE(acts) > MAX_KEPT) return -1;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(acts); i++) {
        PyObject *a = PyTuple_GET_ITEM(acts, i);
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(a, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(a, 1)))
            return -1;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(a, 1), &overflow);
        if (overflow) return -1;
        PyObject *kind = PyTuple_GET_ITEM(a, 0);
        if (PyUnicode_CompareWithASCIIString(kind, "group") == 0) {
            if (v == OWN_GROUP) v = (long long)gid;
            if (v < 0 || v > 0xFFFFFFFFLL) return -1;
            put16(out + n, OFPAT_GROUP);
            put16(out + n + 2, 8);
            put32(out + n + 4, (unsigned long)v);
            n += 8;
        } else if (PyUnicode_CompareWithASCIIString(kind, "output") == 0) {
            if (v < 0 || v > 0xFFFFFFFFLL) return -1;
            put16(out + n, OFPAT_OUTPUT);
            put16(out + n + 2, 16);
            put32(out + n + 4, (unsigned long)v);
            memset(out + n + 8, 0, 8);  /* max_len 0, padding */
            n += 16;
        } else {
            return -1;
        }
    }
    return n;
}

/* Takes the pair Python made for kept actions packed as ``kept`` (n bytes) as the group's
 * layout when it is one: head (its length at 2) + port + tag TLV (10) + tail, the tail
 * ending in the apply-actions instruction: the MAC action (16 bytes), then ``kept``. */
static int rejoins_learn(Rejoins *r, PyObject *ht, const unsigned char *kept, Py_ssize_t n) {
    PyObject *head = PyTuple_GET_ITEM(ht, 0), *tail = PyTuple_GET_ITEM(ht, 1);
    Py_ssize_t nh = PyBytes_GET_SIZE(head), nt = PyBytes_GET_SIZE(tail), ni = 8 + 16 + n;
    const unsigned char *h = (const unsigned char *)PyBytes_AS_STRING(head);
    const unsigned char *t = (const unsigned char *)PyBytes_AS_STRING(tail), *in = t + nt - ni;
    static const unsigned char zeros[4] = {0};
    if (nh < 4 || nt < ni || (Py_ssize_t)get16(h + 2) != nh + 4 + 10 + nt || get16(in) != OFPIT_APPLY_ACTIONS ||
        (Py_ssize_t)get16(in + 2) != ni || memcmp(in + 4, zeros, 4) != 0 || get16(in + 8) != OFPAT_SET_FIELD ||
        get16(in + 10) != 16 || memcmp(in + 24, kept, (size_t)n) != 0)
        return 0;
    r->prefix = PyBytes_FromStringAndSize((const char *)t, nt - ni);
    r->mac = PyBytes_FromStringAndSize((const char *)in + 8, 16);
    if (r->prefix == NULL || r->mac == NULL) {
        rejoins_clear(r);
        return -1;
    }
    Py_INCREF(head);
    r->head = head;
    return 1;
}

/* (head, tail) of the group's rejoin flow for kept actions ``acts``. New reference. */
static PyObject *rejoin_pair(Rejoins *r, PyObject *acts) {
    unsigned char kept[MAX_KEPT * 16];
    Py_ssize_t n = r->state < 0 ? -1 : pack_kept(acts, r->gid, kept);
    if (n >= 0 && r->state == 1) {
        Py_ssize_t nh = PyBytes_GET_SIZE(r->head), np = PyBytes_GET_SIZE(r->prefix), ni = 8 + 16 + n;
        PyObject *pair = PyTuple_New(2);
        PyObject *head = PyBytes_FromStringAndSize(PyBytes_AS_STRING(r->head), nh);
        PyObject *tail = PyBytes_FromStringAndSize(NULL, np + ni);
        if (pair == NULL || head == NULL || tail == NULL) {
            Py_XDECREF(pair);
            Py_XDECREF(head);
            Py_XDECREF(tail);
            return NULL;
        }
        put16((unsigned char *)PyBytes_AS_STRING(head) + 2, (unsigned)(nh + 4 + 10 + np + ni));
        unsigned char *t = (unsigned char *)PyBytes_AS_STRING(tail);
        memcpy(t, PyBytes_AS_STRING(r->prefix), (size_t)np);
        put16(t + np, OFPIT_APPLY_ACTIONS);
        put16(t + np + 2, (unsigned)ni);
        memset(t + np + 4, 0, 4);
        memcpy(t + np + 8, PyBytes_AS_STRING(r->mac), 16);
        memcpy(t + np + 24, kept, (size_t)n);
        PyTuple_SET_ITEM(pair, 0, head);
        PyTuple_SET_ITEM(pair, 1, tail);
        return pair;
    }
    PyObject *ht = PyObject_CallOneArg(r->make, acts);
    if (ht == NULL) return NULL;
    if (!pair_of_bytes(ht)) {
        Py_DECREF(ht);
        return NULL;
    }
    if (r->state == 0 && n >= 0) {  /* (a list not packed here teaches nothing) */
        int got = rejoins_learn(r, ht, kept, n);
        if (got < 0) {
            Py_DECREF(ht);
            return NULL;
        }
        r->state = got ? 1 : -1;
    }
    return ht;
}

/* tree_adds(gid, sg_head, sg_tail, dpids, entries, out, tags, make_tag, rejoin_flow,
 *           group_cls, flow_cls)
 * ofmsgs.tree_adds's loop: see there. ``rejoin_flow(acts)`` gives a rejoin flow's bytes
 * around its in_port and tag. */
static PyObject *tree_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "tree_adds takes 11 arguments");
        return NULL;
    }
    PyObject *sg_head = args[1], *sg_tail = args[2], *dpids = args[3], *entries = args[4], *out = args[5],
             *tags = args[6], *make_tag = args[7], *rejoin_flow = args[8];
    char port[4];
    long gid;
    Slots group_cls, flow_cls;
    if (get_long(args[0], &gid) < 0) return NULL;
    if (gid < 0 || gid > 0xFFFFFFFFL) {
        PyErr_SetString(PyExc_OverflowError, "a group id is 32 bits");
        return NULL;
    }
    if (!PyBytes_Check(sg_head) || !PyBytes_Check(sg_tail) || !PyDict_Check(entries) || !PyList_Check(out) ||
        !PyDict_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tree_adds: bad argument types");
        return NULL;
    }
    if (slots_of(args[9], &group_cls) < 0 || slots_of(args[10], &flow_cls) < 0) return NULL;
    PyObject *seq = PySequence_Fast(dpids, "tree_adds: dpids is a sequence");
    if (seq == NULL) return NULL;
    PyObject *last = NULL, *rj = NULL, *e = NULL;  /* the last rejoin's actions and their flow's bytes */
    Rejoins rjs = {rejoin_flow, (unsigned long)gid, 0, NULL, NULL, NULL};
    PyObject *made = NULL;  /* the messages, sized once, then put at the end of out */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), k = 0, n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {  /* (appending ~300 grew out ~25 times, copying it) */
        PyObject *x = PyDict_GetItemWithError(entries, PySequence_Fast_GET_ITEM(seq, i));
        if (x == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PySequence_Fast_GET_ITEM(seq, i));
            goto fail;
        }
        n += 2 + (PyTuple_Check(x) && PyTuple_GET_SIZE(x) == 4 && PyTuple_Check(PyTuple_GET_ITEM(x, 3)) &&
                  PyTuple_GET_SIZE(PyTuple_GET_ITEM(x, 3)) != 0);
    }
    made = PyList_New(n);
    if (made == NULL) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *dpid = PySequence_Fast_GET_ITEM(seq, i);
        Py_CLEAR(e);
        e = PyDict_GetItemWithError(entries, dpid);
        if (e == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, dpid);
            goto fail;
        }
        Py_INCREF(e);  /* (held while callbacks run) */
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_SetString(PyExc_TypeError, "a switch entry is a 4-tuple");
            goto fail;
        }
        PyObject *wire = group_wire(OFPGC_ADD, (unsigned long)gid, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1),
                                    PyTuple_GET_ITEM(e, 2), 0);
        if (add_msg(made, &group_cls, dpid, wire, &k) < 0) goto fail;
        if (be32_of(PyTuple_GET_ITEM(e, 0), port) < 0) goto fail;
        if (add_msg(made, &flow_cls, dpid, join4(sg_head, port, 4, sg_tail, NULL), &k) < 0) goto fail;
        PyObject *rejoin = PyTuple_GET_ITEM(e, 3);
        if (!PyTuple_Check(rejoin) || PyTuple_GET_SIZE(rejoin) == 0) continue;
        if (PyTuple_GET_SIZE(rejoin) != 3) {
            PyErr_SetString(PyExc_TypeError, "a rejoin is (arrival, tag, actions)");
            goto fail;
        }
        PyObject *acts = PyTuple_GET_ITEM(rejoin, 2);
        if (acts != last) {  /* (a group's rejoins mostly share one action list) */
            Py_XDECREF(rj);
            rj = rejoin_pair(&rjs, acts);
            if (rj == NULL) goto fail;
            Py_INCREF(acts);
            Py_XSETREF(last, acts);
        }
        char match[14];
        if (rejoin_match(tags, make_tag, rejoin, match) < 0) goto fail;
        wire = join4(PyTuple_GET_ITEM(rj, 0), match, 14, PyTuple_GET_ITEM(rj, 1), NULL);
        if (add_msg(made, &flow_cls, dpid, wire, &k) < 0) goto fail;
    }
    if (k != n) {
        PyErr_SetString(PyExc_RuntimeError, "tree_adds: the entries changed while their messages were made");
        goto fail;
    }
    Py_ssize_t end = PyList_GET_SIZE(out);
    if (PyList_SetSlice(out, end, end, made) < 0) goto fail;
    rejoins_clear(&rjs);
    Py_XDECREF(rj);
    Py_XDECREF(last);
    Py_XDECREF(e);
    Py_DECREF(made);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    rejoins_clear(&rjs);
    Py_XDECREF(rj);
    Py_XDECREF(last);
    Py_XDECREF(e);
    Py_XDECREF(made);
    Py_DECREF(seq);
    return NULL;
}

/* A 1- or 2-D buffer of 8-byte integers (numpy intp/int64), read through its strides. */
typedef struct {
    Py_buffer view;
    int held;
} Ints;

static int ints_get(PyObject *o, Ints *a, int ndim) {
    a->held = 0;
    if (PyObject_GetBuffer(o, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    a->held = 1;
    const char *f = a->view.format ? a->view.format : "B";
    if (*f == '@' || *f == '=') f++;
    if (a->view.itemsize != 8 || a->view.ndim != ndim || !(f[0] == 'l' || f[0] == 'q' || f[0] == 'n') || f[1]) {
        PyErr_SetString(PyExc_TypeError, "expected arrays of 8-byte integers");
        return -1;
    }
    return 0;
}

static void ints_release(Ints *a) {
    if (a->held) PyBuffer_Release(&a->view);
    a->held = 0;
}

static inline int64_t at1(const Ints *a, Py_ssize_t i) {
    return *(const int64_t *)((const char *)a->view.buf + i * a->view.strides[0]);
}

static inline int64_t at2(const Ints *a, Py_ssize_t i, Py_ssize_t j) {
    return *(const int64_t *)((const char *)a->view.buf + i * a->view.strides[0] + j * a->view.strides[1]);
}

#define FAR ((int64_t)1 << 60)

/* spt_grid(nodes, hops, around, links, load, size, root, targets, dpids)
 *     -> (parent, used links as bytes, deepest)
 * trees._spt_vector's layered least-loaded search (see there), in one pass over the
 * root's switches: ``nodes``/``hops`` are them in its DAG's (breadth-first) order and
 * their hop counts, ``around``/``links`` every switch's neighbours in dpid order
 * (0-padded) and the links from them, shared by all roots. A switch's predecessors are
 * its neighbours one hop nearer, in dpid order, so the choices are the layers' of
 * _spt_vector_py. Those layers were ~60 KB per source switch, read cold by every new
 * tree (half the benchmark's last-level cache misses); the grid is one array for all
 * roots and stays in cache. */
static PyObject *spt_grid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "spt_grid takes 9 arguments");
        return NULL;
    }
    PyObject *targets = args[7], *dpids = args[8];
    Py_ssize_t size = PyLong_AsSsize_t(args[5]), root = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(dpids) || size < 1 || root < 0 || root >= size || PyList_GET_SIZE(dpids) < size) {
        PyErr_SetString(PyExc_ValueError, "spt_grid: bad size, root or dpids");
        return NULL;
    }
    Ints nodes = {0}, hops = {0}, around = {0}, links = {0}, load = {0};
    int64_t *cost = NULL, *uplink = NULL, *at = NULL;
    Py_ssize_t *choice = NULL, *order = NULL, *ends = NULL;
    char *mark = NULL;
    PyObject *result = NULL, *parent = NULL, *used = NULL, *deepest = NULL;
    Py_ssize_t count = 0, used_layers = 0;
    if (ints_get(args[0], &nodes, 1) < 0 || ints_get(args[1], &hops, 1) < 0 || ints_get(args[2], &around, 2) < 0 ||
        ints_get(args[3], &links, 2) < 0 || ints_get(args[4], &load, 1) < 0)
        goto done;
    Py_ssize_t n_nodes = nodes.view.shape[0], width = around.view.shape[1];
    if (hops.view.shape[0] != n_nodes || around.view.shape[0] < size || links.view.shape[0] != around.view.shape[0] ||
        links.view.shape[1] != width || n_nodes < 1 || at1(&nodes, 0) != root || at1(&hops, 0) != 0) {
        PyErr_SetString(PyExc_ValueError, "spt_grid: the arrays disagree, or the order does not start at the root");
        goto done;
    }
    cost = PyMem_Malloc(sizeof(int64_t) * (size_t)size);
    at = PyMem_Malloc(sizeof(int64_t) * (size_t)size);
    choice = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
    uplink = PyMem_Calloc((size_t)size, sizeof(int64_t));
    mark = PyMem_Calloc((size_t)size, 1);
    order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n_nodes);
    ends = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_nodes + 1));
    if (!cost || !at || !choice || !uplink || !mark || !order || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        cost[i] = FAR;
        at[i] = -2;
    }
    int64_t last_hop = 0;
    for (Py_ssize_t i = 0; i < n_nodes; i++) {
        int64_t n = at1(&nodes, i), h = at1(&hops, i);
        if (n < 0 || n >= size) goto range;
        if (h < last_hop || h > last_hop + 1 || (i > 0 && h == 0)) {
            PyErr_SetString(PyExc_ValueError, "spt_grid: hop counts are not in breadth-first order");
            goto done;
        }
        last_hop = h;
        at[n] = h;
    }
    cost[root] = 0;
    for (Py_ssize_t i = 1; i < n_nodes; i++) {
        int64_t n = at1(&nodes, i), want = at1(&hops, i) - 1, best = -1, bc = 0, bp = 0, bl = 0;
        for (Py_ssize_t j = 0; j < width; j++) {
            int64_t p = at2(&around, n, j);
            if (p == 0) break;  /* (padding: node numbers start at 1) */
            if (p < 0 || p >= size) goto range;
            if (at[p] != want) continue;
            int64_t k = at2(&links, n, j);
            if (k < 0 || k >= load.view.shape[0]) goto range;
            int64_t c = cost[p] + at1(&load, k);
            if (best < 0 || c < bc) {
                best = j;
                bc = c;
                bp = p;
                bl = k;
            }
        }
        if (best < 0) {
            PyErr_SetString(PyExc_ValueError, "spt_grid: a switch without a neighbour one hop nearer");
            goto done;
        }
        cost[n] = bc;
        choice[n] = (Py_ssize_t)bp;
        uplink[n] = bl;
    }
    PyObject *tseq = PySequence_Fast(targets, "spt_grid: targets is a sequence");
    if (tseq == NULL) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(tseq); i++) {
        Py_ssize_t t = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(tseq, i));
        if (t < 0 || t >= size) {
            Py_DECREF(tseq);
            if (!PyErr_Occurred()) goto range;
            goto done;
        }
        mark[t] = 1;
    }
    Py_DECREF(tseq);
    /* from the deepest layer (a run of equal hops) up: a switch is in the tree when
     * marked; it marks its choice */
    for (Py_ssize_t hi = n_nodes; hi > 1;) {
        Py_ssize_t lo = hi - 1;
        while (lo > 1 && at1(&hops, lo - 1) == at1(&hops, hi - 1)) lo--;
        Py_ssize_t before = count;
        for (Py_ssize_t r = lo; r < hi; r++) {
            Py_ssize_t node = (Py_ssize_t)at1(&nodes, r);
            if (mark[node]) order[count++] = node;
        }
        for (Py_ssize_t i = before; i < count; i++) mark[choice[order[i]]] = 1;
        if (count > before) ends[used_layers++] = count;
        hi = lo;
    }
    used = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int64_t) * count);
    deepest = PyList_New(count + 1);
    parent = _PyDict_NewPresized(count + 1);  /* (sized once: ~100 switches per tree) */
    if (used == NULL || deepest == NULL || parent == NULL) goto done;
    int64_t *u = (int64_t *)PyBytes_AS_STRING(used);
    for (Py_ssize_t i = 0; i < count; i++) {
        u[i] = uplink[order[i]];
        PyObject *d = PyList_GET_ITEM(dpids, order[i]);
        Py_INCREF(d);
        PyList_SET_ITEM(deepest, i, d);
    }
    PyObject *rd = PyList_GET_ITEM(dpids, root);
    Py_INCREF(rd);
    PyList_SET_ITEM(deepest, count, rd);
    if (PyDict_SetItem(parent, rd, Py_None) < 0) goto done;
    for (Py_ssize_t k = used_layers - 1; k >= 0; k--) {
        for (Py_ssize_t i = k > 0 ? ends[k - 1] : 0; i < ends[k]; i++) {
            if (PyDict_SetItem(parent, PyList_GET_ITEM(dpids, order[i]), PyList_GET_ITEM(dpids, choice[order[i]])) < 0)
                goto done;
        }
    }
    result = PyTuple_Pack(3, parent, used, deepest);
    goto done;
range:
    PyErr_SetString(PyExc_IndexError, "spt_grid: a node or link number out of range");
done:
    ints_release(&nodes);
    ints_release(&hops);
    ints_release(&around);
    ints_release(&links);
    ints_release(&load);
    PyMem_Free(cost);
    PyMem_Free(at);
    PyMem_Free(choice);
    PyMem_Free(uplink);
    PyMem_Free(mark);
    PyMem_Free(order);
    PyMem_Free(ends);
    Py_XDECREF(parent);
    Py_XDECREF(used);
    Py_XDECREF(deepest);
    return result;
}

/* outs(parent, nbr, ends) -> {switch: [its output ports]}: trees._fill_entries's loop
 * (see there): for each switch of ``parent`` (in its order) the port towards each child,
 * then the receivers' ports of ``ends`` ((switch, port) pairs). */
static PyObject *outs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "outs(parent: dict, nbr: dict, ends)");
        return NULL;
    }
    PyObject *parent = args[0], *nbr = args[1], *result = _PyDict_NewPresized(PyDict_GET_SIZE(args[0])), *it = NULL, *pair = NULL;
    if (result == NULL) return NULL;
    Py_ssize_t pos = 0;
    PyObject *c, *p;
    while (PyDict_Next(parent, &pos, &c, &p)) {
        PyObject *lst = PyList_New(0);
        if (lst == NULL || PyDict_SetItem(result, c, lst) < 0) {
            Py_XDECREF(lst);
            goto fail;
        }
        Py_DECREF(lst);
    }
    pos = 0;
    while (PyDict_Next(parent, &pos, &c, &p)) {
        if (p == Py_None) continue;
        PyObject *to = PyDict_GetItemWithError(nbr, p), *port = NULL, *lst = NULL;
        if (to != NULL && PyDict_Check(to)) port = PyDict_GetItemWithError(to, c);
        if (port != NULL) lst = PyDict_GetItemWithError(result, p);
        if (lst == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no port from %R to %R in the tree", p, c);
            goto fail;
        }
        if (PyList_Append(lst, port) < 0) goto fail;
    }
    it = PyObject_GetIter(args[2]);
    if (it == NULL) goto fail;
    while ((pair = PyIter_Next(it)) != NULL) {
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "an end is (switch, port)");
            goto fail;
        }
        PyObject *lst = PyDict_GetItemWithError(result, PyTuple_GET_ITEM(pair, 0));
        if (lst == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(pair, 0));
            goto fail;
        }
        if (PyList_Append(lst, PyTuple_GET_ITEM(pair, 1)) < 0) goto fail;
        Py_CLEAR(pair);
    }
    if (PyErr_Occurred()) goto fail;
    Py_DECREF(it);
    return result;
fail:
    Py_XDECREF(pair);
    Py_XDECREF(it);
    Py_DECREF(result);
    return NULL;
}

/* into[c][p] += step for each link c -> p of links (p None: no link): the load of each
 * link child <- parent changed by step, kept per child as {parent: count}. */
static int bump_links(PyObject *into, PyObject *links, PyObject *step) {
    Py_ssize_t pos = 0;
    PyObject *c, *p;
    while (PyDict_Next(links, &pos, &c, &p)) {
        if (p == Py_None) continue;
        PyObject *loads = PyDict_GetItemWithError(into, c);
        if (loads == NULL) {
            if (PyErr_Occurred()) return -1;
            loads = PyDict_New();
            if (loads == NULL || PyDict_SetItem(into, c, loads) < 0) {
                Py_XDECREF(loads);
                return -1;
            }
            Py_DECREF(loads);  /* (into holds it) */
        } else if (!PyDict_Check(loads)) {
            PyErr_SetString(PyExc_TypeError, "bump: into holds dicts");
            return -1;
        }
        PyObject *n = PyDict_GetItemWithError(loads, p), *sum;
        if (n == NULL) {
            if (PyErr_Occurred()) return -1;
            sum = Py_NewRef(step);
        } else {
            sum = PyNumber_Add(n, step);
        }
        if (sum == NULL) return -1;
        int rc = PyDict_SetItem(loads, p, sum);
        Py_DECREF(sum);
        if (rc < 0) return -1;
    }
    return 0;
}

/* bump(into, links, step): trees.LinkLoad.add_links's loop (see there). */
static PyObject *bump(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "bump(into: dict, links: dict, step: int)");
        return NULL;
    }
    if (bump_links(args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* crossing(parents, below) -> {gid: [(parent, child), ...]}: trees._crossing_py's scan
 * (see there), in the same orders. */
static PyObject *crossing(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "crossing(parents: dict, below: dict)");
        return NULL;
    }
    PyObject *parents = args[0], *below = args[1], *found = PyDict_New(), *gid, *parent;
    if (found == NULL) return NULL;
    Py_ssize_t pos = 0;
    while (PyDict_Next(parents, &pos, &gid, &parent)) {
        if (!PyDict_Check(parent)) {
            PyErr_SetString(PyExc_TypeError, "crossing: parents holds dicts");
            goto fail;
        }
        PyObject *lst = NULL, *c, *ps;
        Py_ssize_t at = 0;
        while (PyDict_Next(below, &at, &c, &ps)) {
            PyObject *p = PyDict_GetItemWithError(parent, c);
            if (p == NULL) {
                if (PyErr_Occurred()) goto fail;
                continue;
            }
            if (p == Py_None) continue;
            if (!PyList_Check(ps)) {
                PyErr_SetString(PyExc_TypeError, "crossing: below maps a child to a list of parents");
                goto fail;
            }
            int hit = 0;
            Py_INCREF(p);
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ps) && !hit; i++)
                hit = PyObject_RichCompareBool(p, PyList_GET_ITEM(ps, i), Py_EQ);
            if (hit > 0 && lst == NULL) {
                lst = PyList_New(0);
                if (lst == NULL || PyDict_SetItem(found, gid, lst) < 0) {
                    Py_XDECREF(lst);
                    hit = -1;
                } else {
                    Py_DECREF(lst);  /* (found holds it) */
                }
            }
            if (hit > 0) {
                PyObject *pair = PyTuple_Pack(2, p, c);
                if (pair == NULL || PyList_Append(lst, pair) < 0) hit = -1;
                Py_XDECREF(pair);
            }
            Py_DECREF(p);
            if (hit < 0) goto fail;
        }
    }
    return found;
fail:
    Py_DECREF(found);
    return NULL;
}

/* -- graph searches of controller.trees and controller.protect, on the view's adjacency
 * (``nbr_ports``: dpid -> {neighbour dpid: port}) as it is: run once per source switch
 * and per protected link of a topology, in Python they were ~0.4 x the reference of the
 * benchmark's 1000 trees before its first tree. */

/* parent -> [children] of a child -> parent dict, as trees._children. New reference. */
static PyObject *children_of(PyObject *links) {
    PyObject *kids = PyDict_New(), *c, *p;
    Py_ssize_t pos = 0;
    if (kids == NULL) return NULL;
    while (PyDict_Next(links, &pos, &c, &p)) {
        PyObject *got = PyDict_GetItemWithError(kids, p);
        if (got == NULL) {
            if (PyErr_Occurred()) goto fail;
            PyObject *one = PyList_New(1);
            if (one == NULL) goto fail;
            PyList_SET_ITEM(one, 0, Py_NewRef(c));
            int rc = PyDict_SetItem(kids, p, one);
            Py_DECREF(one);
            if (rc < 0) goto fail;
        } else if (PyList_Append(got, c) < 0) {
            goto fail;
        }
    }
    return kids;
fail:
    Py_DECREF(kids);
    return NULL;
}

/* d[k] as a C integer; a missing key is 0 when dflt, else a KeyError. */
static int dict_ll(PyObject *d, PyObject *k, int dflt, long long *out) {
    PyObject *v = PyDict_GetItemWithError(d, k);
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        if (!dflt) {
            PyErr_SetObject(PyExc_KeyError, k);
            return -1;
        }
        *out = 0;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static int set_ll(PyObject *d, PyObject *k, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return -1;
    int rc = PyDict_SetItem(d, k, o);
    Py_DECREF(o);
    return rc;
}

/* x in lst (a list of switch ids), ints compared by value without a rich comparison. */
static int list_has(PyObject *lst, PyObject *x) {
    if (!PyList_Check(lst)) return PySequence_Contains(lst, x);
    int overflow = 0;
    long xv = PyLong_CheckExact(x) ? PyLong_AsLongAndOverflow(x, &overflow) : -1;
    int by_value = PyLong_CheckExact(x) && !overflow && !(xv == -1 && PyErr_Occurred());
    PyErr_Clear();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lst); i++) {
        PyObject *y = PyList_GET_ITEM(lst, i);
        if (y == x) return 1;
        if (by_value && PyLong_CheckExact(y)) {
            long yv = PyLong_AsLongAndOverflow(y, &overflow);
            if (!overflow && yv == xv) return 1;
            if (!(yv == -1 && PyErr_Occurred())) continue;
            PyErr_Clear();
        }
        Py_INCREF(y);
        int eq = PyObject_RichCompareBool(y, x, Py_EQ);
        Py_DECREF(y);
        if (eq != 0) return eq;
    }
    return 0;
}

typedef struct {
    long long dist;
    Py_ssize_t at;
} ByDist;

static int by_dist(const void *a, const void *b) {
    const ByDist *x = a, *y = b;
    if (x->dist != y->dist) return x->dist < y->dist ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* trees._settle (see there) with cost = dict.fromkeys(kept, 0): least-loaded choices for
 * the switches of todo (a list, grown here) and their ancestors not in kept, nearest the
 * root first; cost gets theirs. */
static int settle(PyObject *todo, PyObject *kept, PyObject *cost, PyObject *choice, PyObject *preds,
                  PyObject *dist, PyObject *into) {
    int rc = -1;
    ByDist *order = NULL;
    PyObject *seen = PySet_New(todo), *ps, *p;
    if (seen == NULL) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(todo); i++) {  /* (grows while walked) */
        ps = PyDict_GetItemWithError(preds, PyList_GET_ITEM(todo, i));
        if (ps == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PyList_GET_ITEM(todo, i));
            goto done;
        }
        if (!PyList_Check(ps)) {
            PyErr_SetString(PyExc_TypeError, "preds holds lists");
            goto done;
        }
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ps); j++) {
            p = PyList_GET_ITEM(ps, j);
            int has = PyDict_Contains(kept, p);
            if (has == 0) has = PySet_Contains(seen, p);
            if (has < 0) goto done;
            if (!has && (PySet_Add(seen, p) < 0 || PyList_Append(todo, p) < 0)) goto done;
        }
    }
    Py_ssize_t m = PyList_GET_SIZE(todo);
    order = PyMem_Malloc(sizeof(ByDist) * (size_t)(m ? m : 1));
    if (order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (dict_ll(dist, PyList_GET_ITEM(todo, i), 0, &order[i].dist) < 0) goto done;
        order[i].at = i;
    }
    qsort(order, (size_t)m, sizeof(ByDist), by_dist);  /* (as a stable sort by distance) */
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *n = PyList_GET_ITEM(todo, order[i].at);
        ps = PyDict_GetItemWithError(preds, n);
        if (ps == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            goto done;
        }
        if (!PyList_Check(ps) || PyList_GET_SIZE(ps) == 0) {
            PyErr_SetString(PyExc_ValueError, "settle: a switch to settle has no predecessor");
            goto done;
        }
        PyObject *loads = PyDict_GetItemWithError(into, n), *best_p = NULL;
        if (loads == NULL && PyErr_Occurred()) goto done;
        if (loads != NULL && !PyDict_Check(loads)) {
            PyErr_SetString(PyExc_TypeError, "into holds dicts");
            goto done;
        }
        long long best = 0;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ps); j++) {
            long long c, l = 0;
            p = PyList_GET_ITEM(ps, j);
            int is_kept = PyDict_Contains(kept, p);
            if (is_kept < 0) goto done;
            if (is_kept)
                c = 0;
            else if (dict_ll(cost, p, 0, &c) < 0)
                goto done;
            if (loads != NULL && dict_ll(loads, p, 1, &l) < 0) goto done;
            if (best_p == NULL || c + l < best) {  /* (the first of equal costs: preds are sorted) */
                best = c + l;
                best_p = p;
            }
        }
        if (set_ll(cost, n, best) < 0 || PyDict_SetItem(choice, n, best_p) < 0) goto done;
    }
    rc = 0;
done:
    PyMem_Free(order);
    Py_DECREF(seen);
    return rc;
}

/* Whether switch m has a child in the tree being regrafted (parent): a kept child of its
 * old ones (kids, not walked anew) or one that walked to it (adopted). (The count
 * Counter(parent.values()) keeps in trees.regraft_py, asked only where it is read.)
 * 1 yes, 0 no; on an error 1 with the error set (the caller checks PyErr_Occurred). */
static int has_child(PyObject *parent, PyObject *kids, PyObject *adopted, PyObject *walked, PyObject *m) {
    for (int pass = 0; pass < 2; pass++) {
        PyObject *ks = PyDict_GetItemWithError(pass ? adopted : kids, m);
        if (ks == NULL) {
            if (PyErr_Occurred()) return 1;
            continue;
        }
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ks); j++) {
            PyObject *c = PyList_GET_ITEM(ks, j);
            if (!pass) {
                int w = PyDict_Contains(walked, c);
                if (w < 0) return 1;
                if (w) continue;
            }
            PyObject *pc = PyDict_GetItemWithError(parent, c);
            if (pc == NULL) {
                if (PyErr_Occurred()) return 1;
                continue;
            }
            int eq = PyObject_RichCompareBool(pc, m, Py_EQ);
            if (eq != 0) return 1;  /* (an error: yes, with it set) */
        }
    }
    return 0;
}

/* regraft(was, entries, ends, preds, dist, into, nbr, root, entry_type)
 * trees.regraft_py's steps after its checks (see there), on a tree's parent map (was),
 * entries and ends, the root's DAG (dist, preds), the loads (into: counted here, as
 * LinkLoad.add_links counts) and the neighbours' ports (nbr). Returns None when a receiver
 * is cut off (loads untouched), () when no switch lost its shortest path, else
 * (parent, entries, changed, taken, walked, pruned): the new tree's, the switches where
 * it may differ, and the links taken off, added and taken off (child -> parent). */
static PyObject *regraft(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "regraft takes 9 arguments");
        return NULL;
    }
    PyObject *was = args[0], *old_entries = args[1], *ends = args[2], *preds = args[3], *dist = args[4],
             *into = args[5], *nbr = args[6], *root = args[7];
    if (!PyDict_Check(was) || !PyDict_Check(old_entries) || !PyAnySet_Check(ends) || !PyDict_Check(preds) ||
        !PyDict_Check(dist) || !PyDict_Check(into) || !PyDict_Check(nbr) || !PyType_Check(args[8]) ||
        !PyType_IsSubtype((PyTypeObject *)args[8], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "regraft: was, entries, preds, dist, into and nbr are dicts, ends a "
                                         "set, entry_type a tuple type");
        return NULL;
    }
    PyTypeObject *entry_type = (PyTypeObject *)args[8];
    PyObject *broken = NULL, *kids = NULL, *cut = NULL, *targets = NULL, *lost = NULL, *taken = NULL,
             *parent = NULL, *cost = NULL, *choice = NULL, *walked = NULL, *pruned = NULL, *cuts0 = NULL,
             *cuts = NULL, *changed = NULL, *entries = NULL, *adopted = NULL, *redo = NULL,
             *result = NULL, *it = NULL, *x = NULL, *lists[4] = {NULL, NULL, NULL, NULL}, *n, *p, *ps;
    PyObject *minus = PyLong_FromLong(-1), *plus = PyLong_FromLong(1);
    Py_ssize_t pos = 0;
    if (minus == NULL || plus == NULL) goto done;
    /* the switches whose parent link is no longer a shortest-path link, and all below them */
    if ((broken = PyList_New(0)) == NULL) goto done;
    while (PyDict_Next(was, &pos, &n, &p)) {
        if (p == Py_None) continue;
        ps = PyDict_GetItemWithError(preds, n);
        int in = 0;
        if (ps == NULL) {
            if (PyErr_Occurred()) goto done;
        } else if ((in = list_has(ps, p)) < 0) {
            goto done;
        }
        if (!in && PyList_Append(broken, n) < 0) goto done;
    }
    if (PyList_GET_SIZE(broken) == 0) {
        result = Py_NewRef(empty);
        goto done;
    }
    if ((kids = children_of(was)) == NULL || (cut = PySet_New(broken)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(broken); i++) {  /* (grows while walked) */
        PyObject *ks = PyDict_GetItemWithError(kids, PyList_GET_ITEM(broken, i));
        if (ks == NULL) {
            if (PyErr_Occurred()) goto done;
            continue;
        }
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ks); j++) {
            PyObject *c = PyList_GET_ITEM(ks, j);
            int has = PySet_Contains(cut, c);
            if (has < 0 || (!has && (PySet_Add(cut, c) < 0 || PyList_Append(broken, c) < 0))) goto done;
        }
    }
    if ((targets = PySet_New(NULL)) == NULL || (it = PyObject_GetIter(ends)) == NULL) goto done;
    while ((x = PyIter_Next(it)) != NULL) {
        if (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) != 2) {
            PyErr_SetString(PyExc_TypeError, "ends holds (switch, port) pairs");
            goto done;
        }
        if (PySet_Add(targets, PyTuple_GET_ITEM(x, 0)) < 0) goto done;
        Py_CLEAR(x);
    }
    Py_CLEAR(it);
    if (PyErr_Occurred()) goto done;
    if ((lost = PyList_New(0)) == NULL || (it = PyObject_GetIter(targets)) == NULL) goto done;
    while ((x = PyIter_Next(it)) != NULL) {
        int has = PySet_Contains(cut, x);
        if (has < 0 || (has && PyList_Append(lost, x) < 0)) goto done;
        Py_CLEAR(x);
    }
    Py_CLEAR(it);
    if (PyErr_Occurred()) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lost); i++) {
        int has = PyDict_Contains(dist, PyList_GET_ITEM(lost, i));
        if (has < 0) goto done;
        if (!has) {  /* cut off: unreachable now */
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    /* the cut part's links off the loads; the kept part starts the tree */
    if ((taken = PyDict_New()) == NULL || (parent = PyDict_Copy(was)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(broken); i++) {
        n = PyList_GET_ITEM(broken, i);
        p = PyDict_GetItemWithError(was, n);
        if (p == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            goto done;
        }
        if (PyDict_SetItem(taken, n, p) < 0 || PyDict_DelItem(parent, n) < 0) goto done;
    }
    if (bump_links(into, taken, minus) < 0) goto done;
    if ((cost = PyDict_New()) == NULL || (choice = PyDict_New()) == NULL) goto done;
    PyObject *todo = PyList_GetSlice(lost, 0, PyList_GET_SIZE(lost));
    if (todo == NULL) goto done;
    int settled = settle(todo, parent, cost, choice, preds, dist, into);
    Py_DECREF(todo);
    if (settled < 0) goto done;
    /* the lost targets walk up their choices to the kept tree */
    if (PyList_Sort(lost) < 0 || (walked = PyDict_New()) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lost); i++) {
        n = PyList_GET_ITEM(lost, i);
        for (;;) {
            int has = PyDict_Contains(parent, n);
            if (has < 0) goto done;
            if (has) break;
            p = PyDict_GetItemWithError(choice, n);
            if (p == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
                goto done;
            }
            if (PyDict_SetItem(parent, n, p) < 0 || PyDict_SetItem(walked, n, p) < 0) goto done;
            n = p;  /* (parent holds it) */
        }
    }
    /* kept switches left with no target below are peeled off from the cut upwards */
    if ((pruned = PyDict_New()) == NULL || (cuts0 = PySet_New(NULL)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(broken); i++) {
        p = PyDict_GetItem(was, PyList_GET_ITEM(broken, i));  /* (all there: taken above) */
        int has = PySet_Contains(cut, p);
        if (has < 0 || (!has && PySet_Add(cuts0, p) < 0)) goto done;
    }
    if ((cuts = PyNumber_Subtract(cuts0, targets)) == NULL || PySet_Discard(cuts, root) < 0) goto done;
    if ((adopted = children_of(walked)) == NULL) goto done;
    if (PySet_GET_SIZE(cuts)) {
        if ((it = PyObject_GetIter(cuts)) == NULL) goto done;
        while ((x = PyIter_Next(it)) != NULL) {
            PyObject *m = Py_NewRef(x);
            for (;;) {
                int has = PyDict_Contains(parent, m);
                if (has > 0) has = has_child(parent, kids, adopted, walked, m) ? (PyErr_Occurred() ? -1 : 0) : 1;
                if (has > 0) {
                    int is_root = PyObject_RichCompareBool(m, root, Py_EQ);
                    has = is_root < 0 ? -1 : !is_root;
                }
                if (has > 0) {
                    int is_target = PySet_Contains(targets, m);
                    has = is_target < 0 ? -1 : !is_target;
                }
                if (has <= 0) {
                    Py_DECREF(m);
                    if (has < 0) goto done;
                    break;
                }
                p = Py_NewRef(PyDict_GetItem(parent, m));
                if (PyDict_DelItem(parent, m) < 0 || PyDict_SetItem(pruned, m, p) < 0) {
                    Py_DECREF(p);
                    Py_DECREF(m);
                    goto done;
                }
                Py_DECREF(m);
                m = p;
            }
            Py_CLEAR(x);
        }
        Py_CLEAR(it);
        if (PyErr_Occurred()) goto done;
    }
    if (bump_links(into, walked, plus) < 0 || bump_links(into, pruned, minus) < 0) goto done;
    /* what may differ: switches gone or moved, and those that lost or gained a child */
    for (int i = 0; i < 4; i++)
        if ((lists[i] = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(broken); i++) {  /* gone; the old parents of the cut */
        n = PyList_GET_ITEM(broken, i);
        int has = PyDict_Contains(walked, n);
        if (has < 0 || (!has && PyList_Append(lists[0], n) < 0) ||
            PyList_Append(lists[2], PyDict_GetItem(was, n)) < 0)
            goto done;
    }
    pos = 0;
    while (PyDict_Next(pruned, &pos, &n, &p))
        if (PyList_Append(lists[0], n) < 0 || PyList_Append(lists[3], p) < 0) goto done;
    pos = 0;
    while (PyDict_Next(walked, &pos, &n, &p))
        if (PyList_Append(lists[1], p) < 0) goto done;
    {
        PyObject *start = PySet_New(walked);  /* set(walked).union(gone, walked's parents, ...) */
        if (start == NULL) goto done;
        static PyObject *str_union = NULL;
        if (str_union == NULL && (str_union = PyUnicode_InternFromString("union")) == NULL) {
            Py_DECREF(start);
            goto done;
        }
        changed = PyObject_CallMethodObjArgs(start, str_union, lists[0], lists[1], lists[2], lists[3], NULL);
        Py_DECREF(start);
        if (changed == NULL) goto done;
    }
    if ((entries = PyDict_Copy(old_entries)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lists[0]); i++)
        if (PyDict_DelItem(entries, PyList_GET_ITEM(lists[0], i)) < 0) goto done;
    /* the changed switches still in the tree: their output ports anew */
    if ((redo = PyDict_New()) == NULL ||
        (it = PyObject_GetIter(changed)) == NULL)
        goto done;
    while ((x = PyIter_Next(it)) != NULL) {
        int has = PyDict_Contains(parent, x);
        if (has < 0) goto done;
        if (has) {
            PyObject *to = PyDict_GetItemWithError(nbr, x), *ports = PyList_New(0);
            if (ports == NULL) goto done;
            if (to == NULL || PyDict_SetItem(redo, x, ports) < 0) {
                if (to == NULL && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, x);
                Py_DECREF(ports);
                goto done;
            }
            Py_DECREF(ports);  /* (redo holds it) */
            for (int pass = 0; pass < 2; pass++) {
                PyObject *ks = PyDict_GetItemWithError(pass ? adopted : kids, x);
                if (ks == NULL) {
                    if (PyErr_Occurred()) goto done;
                    continue;
                }
                for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ks); j++) {
                    PyObject *c = PyList_GET_ITEM(ks, j);
                    if (!pass) {  /* kept children: still in the tree and not walked anew */
                        int in = PyDict_Contains(parent, c), w = in > 0 ? PyDict_Contains(walked, c) : 0;
                        if (in < 0 || w < 0) goto done;
                        if (!in || w) continue;
                    }
                    PyObject *q = PyDict_Check(to) ? PyDict_GetItemWithError(to, c) : NULL;
                    if (q == NULL) {
                        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, c);
                        goto done;
                    }
                    if (PyList_Append(ports, q) < 0) goto done;
                }
            }
        }
        Py_CLEAR(x);
    }
    Py_CLEAR(it);
    if (PyErr_Occurred() || (it = PyObject_GetIter(ends)) == NULL) goto done;
    while ((x = PyIter_Next(it)) != NULL) {  /* (checked above: pairs) */
        PyObject *ports = PyDict_GetItemWithError(redo, PyTuple_GET_ITEM(x, 0));
        if ((ports == NULL && PyErr_Occurred()) || (ports != NULL && PyList_Append(ports, PyTuple_GET_ITEM(x, 1)) < 0))
            goto done;
        Py_CLEAR(x);
    }
    Py_CLEAR(it);
    if (PyErr_Occurred()) goto done;
    pos = 0;
    PyObject *ports;
    while (PyDict_Next(redo, &pos, &n, &ports)) {
        PyObject *in_port, *par = PyDict_GetItem(parent, n);  /* (redo's switches are parent's) */
        if (PyList_Sort(ports) < 0) goto done;
        if (par == Py_None) {
            PyObject *re = PyDict_GetItemWithError(old_entries, root);
            if (re == NULL || !PyTuple_Check(re) || PyTuple_GET_SIZE(re) < 1) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "regraft: the root has no entry");
                goto done;
            }
            in_port = PyTuple_GET_ITEM(re, 0);
        } else {
            PyObject *to = PyDict_GetItem(nbr, n);
            in_port = PyDict_Check(to) ? PyDict_GetItemWithError(to, par) : NULL;
            if (in_port == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, par);
                goto done;
            }
        }
        PyObject *out_ports = PyList_AsTuple(ports);
        if (out_ports == NULL) goto done;
        PyObject *e = make_entry(entry_type, in_port, out_ports, empty, empty);
        Py_DECREF(out_ports);
        if (e == NULL) goto done;
        int rc = PyDict_SetItem(entries, n, e);
        Py_DECREF(e);
        if (rc < 0) goto done;
    }
    result = PyTuple_Pack(6, parent, entries, changed, taken, walked, pruned);
done:
    Py_XDECREF(x);
    Py_XDECREF(it);
    for (int i = 0; i < 4; i++) Py_XDECREF(lists[i]);
    Py_XDECREF(minus);
    Py_XDECREF(plus);
    Py_XDECREF(broken);
    Py_XDECREF(kids);
    Py_XDECREF(cut);
    Py_XDECREF(targets);
    Py_XDECREF(lost);
    Py_XDECREF(taken);
    Py_XDECREF(parent);
    Py_XDECREF(cost);
    Py_XDECREF(choice);
    Py_XDECREF(walked);
    Py_XDECREF(pruned);
    Py_XDECREF(cuts0);
    Py_XDECREF(cuts);
    Py_XDECREF(changed);
    Py_XDECREF(entries);
    Py_XDECREF(adopted);
    Py_XDECREF(redo);
    return result;
}

/* bfs_dag on dicts, for nodes that are not ints in range: trees.PathCache.dag's
 * breadth-first search (see there), the same insertion orders (a frontier at a time,
 * neighbours in ``nbr``'s order), predecessor lists sorted. */
static PyObject *bfs_dag_dicts(PyObject *nbr, PyObject *root) {
    PyObject *dist = PyDict_New(), *preds = PyDict_New(), *frontier = PyList_New(0), *nxt = NULL;
    PyObject *result = NULL, *zero = PyLong_FromLong(0), *first = PyList_New(0);
    if (!dist || !preds || !frontier || !zero || !first) goto done;
    if (PyDict_SetItem(dist, root, zero) < 0 || PyDict_SetItem(preds, root, first) < 0 ||
        PyList_Append(frontier, root) < 0)
        goto done;
    long level = 0;
    while (PyList_GET_SIZE(frontier)) {
        level++;
        nxt = PyList_New(0);
        PyObject *du = PyLong_FromLong(level);
        if (nxt == NULL || du == NULL) {
            Py_XDECREF(du);
            goto done;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(frontier); i++) {
            PyObject *u = PyList_GET_ITEM(frontier, i);
            PyObject *adj = PyDict_GetItemWithError(nbr, u);
            if (adj == NULL || !PyDict_Check(adj)) {
                if (!PyErr_Occurred()) {
                    if (adj == NULL) PyErr_SetObject(PyExc_KeyError, u);
                    else PyErr_SetString(PyExc_TypeError, "bfs_dag: nbr holds dicts");
                }
                Py_DECREF(du);
                goto done;
            }
            Py_ssize_t pos = 0;
            PyObject *v, *port;
            while (PyDict_Next(adj, &pos, &v, &port)) {
                PyObject *dv = PyDict_GetItemWithError(dist, v);
                if (dv == NULL) {
                    if (PyErr_Occurred()) {
                        Py_DECREF(du);
                        goto done;
                    }
                    PyObject *lst = PyList_New(1);
                    if (lst == NULL) {
                        Py_DECREF(du);
                        goto done;
                    }
                    Py_INCREF(u);
                    PyList_SET_ITEM(lst, 0, u);
                    int rc = PyDict_SetItem(dist, v, du) < 0 || PyDict_SetItem(preds, v, lst) < 0 ||
                             PyList_Append(nxt, v) < 0;
                    Py_DECREF(lst);
                    if (rc) {
                        Py_DECREF(du);
                        goto done;
                    }
                } else if (PyLong_AsLong(dv) == level) {
                    PyObject *lst = PyDict_GetItemWithError(preds, v);
                    if (lst == NULL || PyList_Append(lst, u) < 0) {
                        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, v);
                        Py_DECREF(du);
                        goto done;
                    }
                }
            }
        }
        Py_DECREF(du);
        Py_SETREF(frontier, nxt);
        nxt = NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *lst;
    while (PyDict_Next(preds, &pos, &k, &lst))
        if (PyList_GET_SIZE(lst) > 1 && PyList_Sort(lst) < 0) goto done;
    result = PyTuple_Pack(2, dist, preds);
done:
    Py_XDECREF(dist);
    Py_XDECREF(preds);
    Py_XDECREF(frontier);
    Py_XDECREF(nxt);
    Py_XDECREF(zero);
    Py_XDECREF(first);
    return result;
}

/* -- switch numbers as C keys ---------------------------------------------------------
 * The searches done once per topology (bfs_dag, path_around) look a node's state up per
 * edge: ~6,000 Python dict lookups per DAG on fat-tree:16 were half of building one. Here
 * a node is found by its int value in an open-addressing table; a search meeting a node
 * that is not an int (or more nodes than the table was sized for) runs again on dicts. */
typedef struct {
    long long *keys;
    Py_ssize_t *slot; /* the node's number, -1 where empty */
    size_t mask;
} Ids;

static void ids_free(Ids *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->slot);
    m->keys = NULL;
    m->slot = NULL;
}

static int ids_init(Ids *m, Py_ssize_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2 + 2) cap <<= 1;
    m->keys = PyMem_Malloc(sizeof(long long) * cap);
    m->slot = PyMem_Malloc(sizeof(Py_ssize_t) * cap);
    m->mask = cap - 1;
    if (m->keys == NULL || m->slot == NULL) {
        ids_free(m);
        PyErr_NoMemory();
        return -1;
    }
    memset(m->slot, 0xff, sizeof(Py_ssize_t) * cap);
    return 0;
}

/* The number of node k, or -1 when it has none (*at: where it would go). */
static inline Py_ssize_t ids_find(const Ids *m, long long k, size_t *at) {
    size_t h = (size_t)(((unsigned long long)k * 0x9E3779B97F4A7C15ULL) >> 32) & m->mask;
    while (m->slot[h] >= 0) {
        if (m->keys[h] == k) {
            *at = h;
            return m->slot[h];
        }
        h = (h + 1) & m->mask;
    }
    *at = h;
    return -1;
}

/* An exact int's value; *ok cleared (no error set) for anything else or out of range. */
static inline long long key_of(PyObject *o, int *ok) {
    if (!PyLong_CheckExact(o)) {
        *ok = 0;
        return 0;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) *ok = 0;
    return v;
}

/* bfs_dag on Ids (see bfs_dag): NULL with *again set (no error) when it must run on dicts. */
static PyObject *bfs_dag_ids(PyObject *nbr, PyObject *root, int *again) {
    int ok = 1;
    long long rk = key_of(root, &ok);
    if (!ok) {
        *again = 1;
        return NULL;
    }
    Py_ssize_t cap = PyDict_GET_SIZE(nbr) + 1, count = 1, nf = 1;
    Ids m = {NULL, NULL, 0};
    Py_ssize_t *level = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)cap);
    PyObject **plist = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap);  /* (borrowed: preds holds them) */
    PyObject **front = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap), **next = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap);
    /* (sized once: a connected fabric's DAG holds every switch) */
    PyObject *dist = _PyDict_NewPresized(cap), *preds = _PyDict_NewPresized(cap), *result = NULL;
    PyObject *zero = PyLong_FromLong(0), *first = PyList_New(0);
    size_t at;
    if (!level || !plist || !front || !next) PyErr_NoMemory();
    if (PyErr_Occurred() || !dist || !preds || !zero || !first || ids_init(&m, cap) < 0) goto done;
    ids_find(&m, rk, &at);
    m.keys[at] = rk;
    m.slot[at] = 0;
    level[0] = 0;
    plist[0] = first;
    front[0] = root;
    if (PyDict_SetItem(dist, root, zero) < 0 || PyDict_SetItem(preds, root, first) < 0) goto done;
    for (Py_ssize_t lvl = 1; nf; lvl++) {
        Py_ssize_t nn = 0;
        PyObject *du = PyLong_FromSsize_t(lvl);
        if (du == NULL) goto done;
        for (Py_ssize_t i = 0; i < nf; i++) {
            PyObject *u = front[i];
            PyObject *adj = PyDict_GetItemWithError(nbr, u);
            if (adj == NULL || !PyDict_Check(adj)) {
                if (!PyErr_Occurred()) {
                    if (adj == NULL) PyErr_SetObject(PyExc_KeyError, u);
                    else PyErr_SetString(PyExc_TypeError, "bfs_dag: nbr holds dicts");
                }
                Py_DECREF(du);
                goto done;
            }
            long long uk = key_of(u, &ok);  /* (a node found before: an int) */
            Py_ssize_t pos = 0;
            PyObject *v, *port;
            while (PyDict_Next(adj, &pos, &v, &port)) {
                long long vk = key_of(v, &ok);
                if (!ok) break;
                Py_ssize_t x = ids_find(&m, vk, &at);
                if (x < 0) {
                    if (count == cap) {  /* (neighbours that are no switch: the dicts raise) */
                        ok = 0;
                        break;
                    }
                    x = count++;
                    m.keys[at] = vk;
                    m.slot[at] = x;
                    level[x] = lvl;
                    PyObject *lst = PyList_New(1);
                    if (lst == NULL) {
                        Py_DECREF(du);
                        goto done;
                    }
                    Py_INCREF(u);
                    PyList_SET_ITEM(lst, 0, u);
                    plist[x] = lst;
                    int rc = PyDict_SetItem(dist, v, du) < 0 || PyDict_SetItem(preds, v, lst) < 0;
                    Py_DECREF(lst);
                    if (rc) {
                        Py_DECREF(du);
                        goto done;
                    }
                    next[nn++] = v;
                } else if (level[x] == lvl) {  /* another predecessor: kept in order of value */
                    PyObject *lst = plist[x];
                    Py_ssize_t k = PyList_GET_SIZE(lst);
                    while (k > 0 && PyLong_AsLongLong(PyList_GET_ITEM(lst, k - 1)) > uk) k--;
                    if (PyList_Insert(lst, k, u) < 0) {
                        Py_DECREF(du);
                        goto done;
                    }
                }
            }
            if (!ok) {
                Py_DECREF(du);
                *again = 1;
                goto done;
            }
        }
        Py_DECREF(du);
        PyObject **t = front;
        front = next;
        next = t;
        nf = nn;
    }
    result = PyTuple_Pack(2, dist, preds);
done:
    ids_free(&m);
    PyMem_Free(level);
    PyMem_Free(plist);
    PyMem_Free(front);
    PyMem_Free(next);
    Py_XDECREF(dist);
    Py_XDECREF(preds);
    Py_XDECREF(zero);
    Py_XDECREF(first);
    return result;
}

/* bfs_dag(nbr, root) -> (dist, preds): trees._bfs_dag_py's search (see there), the same
 * dicts in the same orders; on Ids when every node is an int. */
static PyObject *bfs_dag(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bfs_dag(nbr: dict, root)");
        return NULL;
    }
    int again = 0;
    PyObject *r = bfs_dag_ids(args[0], args[1], &again);
    return r != NULL || !again ? r : bfs_dag_dicts(args[0], args[1]);
}

/* A detour's meeting: of the level's candidates the least (length, hint misses, hash of
 * the link and the meeting, v, u) wins, protect._path_around_py's order. */
typedef struct {
    int found;
    long len, miss;
    uint32_t hash;
    unsigned long long v, u;
} Meet;

/* Takes candidate (v, u) when it beats the best so far: 1 when it does. */
static inline int meet_better(Meet *m, long len, long miss, uint32_t salt, unsigned long long v, unsigned long long u) {
    uint32_t h = ((((uint32_t)v * 0xC2B2AE3Du) ^ ((uint32_t)u * 0x27D4EB2Fu) ^ salt) * 0x2C1B3C6Du) >> 8;
    if (m->found &&
        !(len < m->len || (len == m->len && (miss < m->miss || (miss == m->miss && (h < m->hash ||
          (h == m->hash && (v < m->v || (v == m->v && u < m->u)))))))))
        return 0;
    m->found = 1;
    m->len = len;
    m->miss = miss;
    m->hash = h;
    m->v = v;
    m->u = u;
    return 1;
}

/* One side of path_around's search: node -> parent (None at the side's root), node ->
 * the side's first hop to it (None at the root), node -> depth, and the frontier. */
typedef struct {
    PyObject *parent, *hop, *depth, *front;
} Side;

static void side_clear(Side *s) {
    Py_CLEAR(s->parent);
    Py_CLEAR(s->hop);
    Py_CLEAR(s->depth);
    Py_CLEAR(s->front);
}

static int side_init(Side *s, PyObject *root) {
    s->parent = PyDict_New();
    s->hop = PyDict_New();
    s->depth = PyDict_New();
    s->front = PyList_New(0);
    PyObject *zero = PyLong_FromLong(0);
    int rc = (!s->parent || !s->hop || !s->depth || !s->front || !zero ||
              PyDict_SetItem(s->parent, root, Py_None) < 0 || PyDict_SetItem(s->hop, root, Py_None) < 0 ||
              PyDict_SetItem(s->depth, root, zero) < 0 || PyList_Append(s->front, root) < 0) ? -1 : 0;
    Py_XDECREF(zero);
    return rc;
}

/* d[k] as a C long (KeyError when absent). */
static int dict_long(PyObject *d, PyObject *k, long *out) {
    PyObject *v = PyDict_GetItemWithError(d, k);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k);
        return -1;
    }
    return get_long(v, out);
}

static int ull_of(PyObject *o, unsigned long long *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* ``hop[k] or fallback`` != ``want`` (Python's truth of a dpid: 0 is false) */
static int hop_differs(PyObject *hop, PyObject *k, PyObject *fallback, PyObject *want) {
    PyObject *h = PyDict_GetItemWithError(hop, k);
    if (h == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k);
        return -1;
    }
    int truth = PyObject_IsTrue(h);
    if (truth < 0) return -1;
    int eq = PyObject_RichCompareBool(truth ? h : fallback, want, Py_EQ);
    return eq < 0 ? -1 : !eq;
}

/* Append n, its parent, theirs... up to the side's root (whose parent is None). */
static int chain(PyObject *path, PyObject *parent, PyObject *n) {
    while (n != Py_None) {
        if (PyList_Append(path, n) < 0) return -1;
        n = PyDict_GetItemWithError(parent, n);
        if (n == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "path_around: broken parents");
            return -1;
        }
    }
    return 0;
}

/* path_around on dicts, for nodes that are not ints in 0..2**63 (negative ones raise):
 * protect._path_around's two-sided search (see there), the same choices: a meeting is
 * the least of (length, hint misses, hash, v, u) over the level's candidates (meet_better),
 * so the order candidates are seen in does not matter; a level expands in the
 * frontier's order, neighbours sorted. */
static PyObject *path_around_dicts(PyObject *nbr, PyObject *src, PyObject *dst, PyObject *hint) {
    int has;
    if ((has = PyDict_Contains(nbr, src)) <= 0) return has < 0 ? NULL : Py_NewRef(Py_None);
    if ((has = PyDict_Contains(nbr, dst)) <= 0) return has < 0 ? NULL : Py_NewRef(Py_None);
    unsigned long long s64, d64;
    if (ull_of(src, &s64) < 0 || ull_of(dst, &d64) < 0) return NULL;
    uint32_t salt = (uint32_t)s64 * 0x9E3779B1u ^ (uint32_t)d64 * 0x85EBCA77u;
    Side sides[2] = {{0}, {0}};
    PyObject *result = NULL, *sorted = NULL, *nxt = NULL;
    if (side_init(&sides[0], src) < 0 || side_init(&sides[1], dst) < 0) goto done;
    while (PyList_GET_SIZE(sides[0].front) && PyList_GET_SIZE(sides[1].front)) {
        int side = PyList_GET_SIZE(sides[0].front) <= PyList_GET_SIZE(sides[1].front) ? 0 : 1;
        Side *mine = &sides[side], *other = &sides[1 - side];
        long level;
        if (dict_long(mine->depth, PyList_GET_ITEM(mine->front, 0), &level) < 0) goto done;
        level += 1;
        Meet meet = {0};
        PyObject *mv = NULL, *mu = NULL;  /* (borrowed: keys of nbr's dicts) */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(mine->front); i++) {
            PyObject *u = PyList_GET_ITEM(mine->front, i);
            PyObject *adj = PyDict_GetItemWithError(nbr, u);
            if (adj == NULL || !PyDict_Check(adj)) {
                if (!PyErr_Occurred()) {
                    if (adj == NULL) PyErr_SetObject(PyExc_KeyError, u);
                    else PyErr_SetString(PyExc_TypeError, "path_around: nbr holds dicts");
                }
                goto done;
            }
            unsigned long long u64;
            if (ull_of(u, &u64) < 0) goto done;
            Py_ssize_t pos = 0;
            PyObject *v, *port;
            while (PyDict_Next(adj, &pos, &v, &port)) {
                if ((has = PyDict_Contains(other->parent, v)) <= 0) {
                    if (has < 0) goto done;
                    continue;
                }
                unsigned long long v64;
                if (ull_of(v, &v64) < 0) goto done;
                if ((u64 == s64 && v64 == d64) || (u64 == d64 && v64 == s64)) continue;
                if ((has = PyDict_Contains(mine->parent, v)) != 0) {
                    if (has < 0) goto done;
                    continue;
                }
                long miss = 0, far;
                if (hint != Py_None) {
                    PyObject *a = side == 0 ? u : v, *b = side == 0 ? v : u;
                    int m1 = hop_differs(sides[1].hop, b, a, PyTuple_GET_ITEM(hint, 1));
                    int m0 = m1 < 0 ? -1 : hop_differs(sides[0].hop, a, b, PyTuple_GET_ITEM(hint, 0));
                    if (m0 < 0) goto done;
                    miss = 2 * m1 + m0;
                }
                if (dict_long(other->depth, v, &far) < 0) goto done;
                if (meet_better(&meet, level + far, miss, salt, v64, u64)) {
                    mv = v;
                    mu = u;
                }
            }
        }
        if (meet.found) {
            if (PyDict_SetItem(mine->parent, mv, mu) < 0) goto done;
            PyObject *path = PyList_New(0), *n = NULL;
            if (path == NULL) goto done;
            if (chain(path, sides[0].parent, mv) < 0 || PyList_Reverse(path) < 0 ||  /* src .. mv */
                (n = PyDict_GetItemWithError(sides[1].parent, mv)) == NULL || chain(path, sides[1].parent, n) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "path_around: broken parents");
                Py_DECREF(path);
                goto done;
            }
            result = path;
            goto done;
        }
        nxt = PyList_New(0);
        PyObject *lv = PyLong_FromLong(level);
        if (nxt == NULL || lv == NULL) {
            Py_XDECREF(lv);
            goto done;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(mine->front); i++) {
            PyObject *u = PyList_GET_ITEM(mine->front, i);
            PyObject *adj = PyDict_GetItemWithError(nbr, u);  /* (checked above) */
            unsigned long long u64;
            if (adj == NULL || ull_of(u, &u64) < 0) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, u);
                Py_DECREF(lv);
                goto done;
            }
            Py_XSETREF(sorted, PyDict_Keys(adj));
            if (sorted == NULL || PyList_Sort(sorted) < 0) {
                Py_DECREF(lv);
                goto done;
            }
            PyObject *pu = PyDict_GetItemWithError(mine->parent, u);
            PyObject *hu = pu == NULL ? NULL : PyDict_GetItemWithError(mine->hop, u);
            if (hu == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, u);
                Py_DECREF(lv);
                goto done;
            }
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(sorted); j++) {
                PyObject *v = PyList_GET_ITEM(sorted, j);
                unsigned long long v64;
                if ((has = PyDict_Contains(mine->parent, v)) != 0 || ull_of(v, &v64) < 0) {
                    if (has < 0 || PyErr_Occurred()) {
                        Py_DECREF(lv);
                        goto done;
                    }
                    continue;
                }
                if ((u64 == s64 && v64 == d64) || (u64 == d64 && v64 == s64)) continue;
                if (PyDict_SetItem(mine->parent, v, u) < 0 ||
                    PyDict_SetItem(mine->hop, v, pu == Py_None ? v : hu) < 0 ||
                    PyDict_SetItem(mine->depth, v, lv) < 0 || PyList_Append(nxt, v) < 0) {
                    Py_DECREF(lv);
                    goto done;
                }
            }
        }
        Py_DECREF(lv);
        Py_SETREF(mine->front, nxt);
        nxt = NULL;
    }
    result = Py_NewRef(Py_None);
done:
    side_clear(&sides[0]);
    side_clear(&sides[1]);
    Py_XDECREF(sorted);
    Py_XDECREF(nxt);
    return result;
}

/* The table twice as large, its nodes kept. */
static int ids_grow(Ids *m) {
    Ids bigger;
    size_t cap = (m->mask + 1) * 2;
    bigger.keys = PyMem_Malloc(sizeof(long long) * cap);
    bigger.slot = PyMem_Malloc(sizeof(Py_ssize_t) * cap);
    bigger.mask = cap - 1;
    if (bigger.keys == NULL || bigger.slot == NULL) {
        ids_free(&bigger);
        PyErr_NoMemory();
        return -1;
    }
    memset(bigger.slot, 0xff, sizeof(Py_ssize_t) * cap);
    for (size_t h = 0; h <= m->mask; h++) {
        if (m->slot[h] < 0) continue;
        size_t at;
        ids_find(&bigger, m->keys[h], &at);
        bigger.keys[at] = m->keys[h];
        bigger.slot[at] = m->slot[h];
    }
    ids_free(m);
    *m = bigger;
    return 0;
}

/* path_around on Ids (see path_around): per node, for each side, whether it is on it, its
 * parent and first hop there (-1: none, the side's root) and depth. NULL with *again set
 * (no error) when it must run on dicts. */
typedef struct {
    Ids ids;
    Py_ssize_t count, cap;
    PyObject **obj;  /* (borrowed: keys of nbr's dicts, or src / dst) */
    long long *key;
    char *on[2];
    Py_ssize_t *par[2], *hop[2], *dep[2];
} Around;

/* The number of node o (value k), given one if it has none (on neither side yet); -1:
 * no room, -2: an error. */
static Py_ssize_t around_node(Around *a, PyObject *o, long long k) {
    size_t at;
    Py_ssize_t x = ids_find(&a->ids, k, &at);
    if (x >= 0) return x;
    if (a->count == a->cap) return -1;
    if ((size_t)(a->count + 1) * 2 > a->ids.mask + 1) {
        if (ids_grow(&a->ids) < 0) return -2;
        ids_find(&a->ids, k, &at);
    }
    x = a->count++;
    a->ids.keys[at] = k;
    a->ids.slot[at] = x;
    a->obj[x] = o;
    a->key[x] = k;
    a->on[0][x] = a->on[1][x] = 0;
    return x;
}

/* ``hop[x] or fallback`` != want, with dpid 0 false as in Python. */
static int hop_misses(const Around *a, int side, Py_ssize_t x, Py_ssize_t fallback, PyObject *want) {
    Py_ssize_t h = a->hop[side][x];
    Py_ssize_t y = h >= 0 && a->key[h] != 0 ? h : fallback;
    int eq = PyObject_RichCompareBool(a->obj[y], want, Py_EQ);
    return eq < 0 ? -1 : !eq;
}

static PyObject *path_around_ids(PyObject *nbr, PyObject *src, PyObject *dst, PyObject *hint, int *again) {
    int ok = 1;
    long long sk = key_of(src, &ok), dk = key_of(dst, &ok);
    if (!ok || sk < 0 || dk < 0) {  /* (the dicts' search refuses a negative dpid) */
        *again = 1;
        return NULL;
    }
    int has;
    if ((has = PyDict_Contains(nbr, src)) <= 0) return has < 0 ? NULL : Py_NewRef(Py_None);
    if ((has = PyDict_Contains(nbr, dst)) <= 0) return has < 0 ? NULL : Py_NewRef(Py_None);
    Around a;
    memset(&a, 0, sizeof a);
    a.cap = PyDict_GET_SIZE(nbr) + 2;
    size_t n = (size_t)a.cap;
    /* obj, key, par/hop/dep of both sides, the two fronts and the next: one block */
    char *block = PyMem_Malloc(n * (sizeof(PyObject *) + sizeof(long long) + 9 * sizeof(Py_ssize_t) + 2));
    PyObject *result = NULL;
    if (block == NULL) return PyErr_NoMemory();
    a.obj = (PyObject **)block;
    a.key = (long long *)(a.obj + n);
    Py_ssize_t *p = (Py_ssize_t *)(a.key + n);
    a.par[0] = p, a.par[1] = p + n, a.hop[0] = p + 2 * n, a.hop[1] = p + 3 * n;
    a.dep[0] = p + 4 * n, a.dep[1] = p + 5 * n;
    Py_ssize_t *front[2] = {p + 6 * n, p + 7 * n}, *nxt = p + 8 * n, nf[2] = {1, 1};
    a.on[0] = (char *)(p + 9 * n);
    a.on[1] = a.on[0] + n;
    a.ids.keys = NULL;
    a.ids.slot = NULL;
    {
        Ids small;
        small.keys = PyMem_Malloc(sizeof(long long) * 64);
        small.slot = PyMem_Malloc(sizeof(Py_ssize_t) * 64);
        small.mask = 63;
        if (small.keys == NULL || small.slot == NULL) {
            ids_free(&small);
            PyErr_NoMemory();
            goto done;
        }
        memset(small.slot, 0xff, sizeof(Py_ssize_t) * 64);
        a.ids = small;
    }
    uint32_t salt = (uint32_t)sk * 0x9E3779B1u ^ (uint32_t)dk * 0x85EBCA77u;
    PyObject *ends[2] = {src, dst};
    long long ek[2] = {sk, dk};
    for (int sd = 0; sd < 2; sd++) {
        Py_ssize_t x = around_node(&a, ends[sd], ek[sd]);
        if (x < 0) goto done;  /* (cannot happen: room for two) */
        a.on[sd][x] = 1;
        a.par[sd][x] = a.hop[sd][x] = -1;
        a.dep[sd][x] = 0;
        front[sd][0] = x;
    }
    while (nf[0] && nf[1]) {
        int side = nf[0] <= nf[1] ? 0 : 1, other = 1 - side;
        Py_ssize_t level = a.dep[side][front[side][0]] + 1;
        Meet meet = {0};
        Py_ssize_t mv = -1, mu = -1;
        for (Py_ssize_t i = 0; i < nf[side]; i++) {
            Py_ssize_t ux = front[side][i];
            PyObject *u = a.obj[ux], *adj = PyDict_GetItemWithError(nbr, u);
            if (adj == NULL || !PyDict_Check(adj)) {
                if (!PyErr_Occurred()) {
                    if (adj == NULL) PyErr_SetObject(PyExc_KeyError, u);
                    else PyErr_SetString(PyExc_TypeError, "path_around: nbr holds dicts");
                }
                goto done;
            }
            long long uk = a.key[ux];
            Py_ssize_t pos = 0;
            PyObject *v, *port;
            while (PyDict_Next(adj, &pos, &v, &port)) {
                long long vk = key_of(v, &ok);
                if (!ok || vk < 0) {
                    *again = 1;
                    goto done;
                }
                size_t at;
                Py_ssize_t vx = ids_find(&a.ids, vk, &at);
                if (vx < 0 || !a.on[other][vx]) continue;
                if ((uk == sk && vk == dk) || (uk == dk && vk == sk) || a.on[side][vx]) continue;
                long miss = 0;
                if (hint != Py_None) {
                    Py_ssize_t ax = side == 0 ? ux : vx, bx = side == 0 ? vx : ux;
                    int m1 = hop_misses(&a, 1, bx, ax, PyTuple_GET_ITEM(hint, 1));
                    int m0 = m1 < 0 ? -1 : hop_misses(&a, 0, ax, bx, PyTuple_GET_ITEM(hint, 0));
                    if (m0 < 0) goto done;
                    miss = 2 * m1 + m0;
                }
                if (meet_better(&meet, (long)(level + a.dep[other][vx]), miss, salt, (unsigned long long)vk,
                                (unsigned long long)uk)) {
                    mv = vx;
                    mu = ux;
                }
            }
        }
        if (meet.found) {  /* mv joins mine below mu: src .. mv on side 0's parents, then on to dst */
            a.on[side][mv] = 1;
            a.par[side][mv] = mu;
            Py_ssize_t len0 = 0;
            for (Py_ssize_t x = mv; x >= 0; x = a.par[0][x]) len0++;
            Py_ssize_t len1 = 0;
            for (Py_ssize_t x = a.par[1][mv]; x >= 0; x = a.par[1][x]) len1++;
            PyObject *path = PyList_New(len0 + len1);
            if (path == NULL) goto done;
            Py_ssize_t k = len0;
            for (Py_ssize_t x = mv; x >= 0; x = a.par[0][x]) PyList_SET_ITEM(path, --k, Py_NewRef(a.obj[x]));
            k = len0;
            for (Py_ssize_t x = a.par[1][mv]; x >= 0; x = a.par[1][x]) PyList_SET_ITEM(path, k++, Py_NewRef(a.obj[x]));
            result = path;
            goto done;
        }
        Py_ssize_t nn = 0;
        for (Py_ssize_t i = 0; i < nf[side]; i++) {
            Py_ssize_t ux = front[side][i];
            PyObject *adj = PyDict_GetItemWithError(nbr, a.obj[ux]);  /* (checked above) */
            if (adj == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, a.obj[ux]);
                goto done;
            }
            /* the neighbours in order of value (sorted(nbr[u])): insertion into nxt's tail */
            Py_ssize_t start = nn, pos = 0;
            PyObject *v, *port;
            long long uk = a.key[ux];
            while (PyDict_Next(adj, &pos, &v, &port)) {
                long long vk = key_of(v, &ok);
                if (!ok || vk < 0) {
                    *again = 1;
                    goto done;
                }
                Py_ssize_t vx = around_node(&a, v, vk);
                if (vx == -2) goto done;
                if (vx == -1) {  /* (more nodes than nbr holds: neighbours that are no switch) */
                    *again = 1;
                    goto done;
                }
                if (a.on[side][vx] || (uk == sk && vk == dk) || (uk == dk && vk == sk)) continue;
                Py_ssize_t k = nn++;
                while (k > start && a.key[nxt[k - 1]] > vk) {
                    nxt[k] = nxt[k - 1];
                    k--;
                }
                nxt[k] = vx;
            }
            for (Py_ssize_t j = start; j < nn; j++) {  /* (then taken in that order) */
                Py_ssize_t vx = nxt[j];
                a.on[side][vx] = 1;
                a.par[side][vx] = ux;
                a.hop[side][vx] = a.par[side][ux] < 0 ? vx : a.hop[side][ux];
                a.dep[side][vx] = level;
            }
        }
        memcpy(front[side], nxt, sizeof(Py_ssize_t) * (size_t)nn);
        nf[side] = nn;
    }
    result = Py_NewRef(Py_None);
done:
    ids_free(&a.ids);
    PyMem_Free(block);
    return result;
}

/* path_around(nbr, src, dst, hint) -> list of dpids or None: protect._path_around's
 * two-sided search (see there), the same choices; on Ids when its nodes are ints in
 * 0..2**63, else on dicts. */
static PyObject *path_around(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "path_around(nbr: dict, src, dst, hint)");
        return NULL;
    }
    PyObject *hint = args[3];
    if (hint != Py_None && (!PyTuple_Check(hint) || PyTuple_GET_SIZE(hint) != 2)) {
        PyErr_SetString(PyExc_TypeError, "path_around: hint is None or a pair");
        return NULL;
    }
    int again = 0;
    PyObject *r = path_around_ids(args[0], args[1], args[2], hint, &again);
    return r != NULL || !again ? r : path_around_dicts(args[0], args[1], args[2], hint);
}

/* -- a reroute's messages (MulticastCore._diff_switches_py's loop, see there) ---------- */

#define OFPGC_MODIFY 1
#define OFPGC_DELETE 2

static Slots flow_slots, group_slots;  /* (ReadyFlowMod's and ReadyGroupMod's, once) */

static int slots_for(PyObject *cls, Slots *cache) {
    if (cache->type != NULL && (PyObject *)cache->type == cls) return 0;
    Slots s;
    if (slots_of(cls, &s) < 0) return -1;
    *cache = s;
    return 0;
}

/* Append (dpid, message) to lst (ready_pair; wire stolen). */
static int put_msg(PyObject *lst, const Slots *s, PyObject *dpid, PyObject *wire) {
    PyObject *pair = ready_pair(s, dpid, wire);
    if (pair == NULL) return -1;
    int rc = PyList_Append(lst, pair);
    Py_DECREF(pair);
    return rc;
}

/* -- protect.Detours._miss_py: the detour around a link end, found and indexed --------
 * A new core's first trees ask for ~4,100 link ends' detours on fat-tree:16: the search
 * is path_around's, and the rest (the link's far end, the pair's cached path, the hops,
 * the by-edge index) was ~0.015 s of Python. The same steps and the same state as
 * _miss_py, whose docstring says why each is there. parts: (MAX_PORT, MAX_TAG_DPID,
 * Detour). */
static PyObject *str_paths, *str_none, *str_by_edge, *str_around, *str_pair, *str_hint, *str_far_end,
    *str_nbr_ports, *str_port_link, *str_port_of, *str_view_attr;

static PyObject *ordered_pair(PyObject *x, PyObject *y) {
    int lt = PyObject_RichCompareBool(x, y, Py_LT);
    if (lt < 0) return NULL;
    return lt ? PyTuple_Pack(2, x, y) : PyTuple_Pack(2, y, x);
}

/* protect._detour: the Detour along path (a list, from the link's one end to its other). */
static PyObject *detour_along(PyObject *nbr, PyObject *path, PyTypeObject *type) {
    Py_ssize_t n = PyList_GET_SIZE(path);
    if (n < 2) {
        PyErr_SetString(PyExc_ValueError, "detour_miss: a path has at least two switches");
        return NULL;
    }
    PyObject *hops = PyTuple_New(n - 2), *first = NULL, *arrival = NULL, *d = NULL;
    if (!hops) return NULL;
    for (Py_ssize_t i = 1; i < n - 1; i++) {
        PyObject *x = PyList_GET_ITEM(path, i);
        PyObject *at = PyObject_GetItem(nbr, x);
        PyObject *in = at ? PyObject_GetItem(at, PyList_GET_ITEM(path, i - 1)) : NULL;
        PyObject *out = in ? PyObject_GetItem(at, PyList_GET_ITEM(path, i + 1)) : NULL;
        PyObject *hop = out ? PyTuple_Pack(3, x, in, out) : NULL;
        Py_XDECREF(out);
        Py_XDECREF(in);
        Py_XDECREF(at);
        if (!hop) goto done;
        PyTuple_SET_ITEM(hops, i - 1, hop);
    }
    PyObject *at = PyObject_GetItem(nbr, PyList_GET_ITEM(path, 0));
    first = at ? PyObject_GetItem(at, PyList_GET_ITEM(path, 1)) : NULL;
    Py_XDECREF(at);
    at = first ? PyObject_GetItem(nbr, PyList_GET_ITEM(path, n - 1)) : NULL;
    arrival = at ? PyObject_GetItem(at, PyList_GET_ITEM(path, n - 2)) : NULL;
    Py_XDECREF(at);
    if (arrival) {
        d = type->tp_alloc(type, 4);
        if (d) {
            Py_INCREF(first);
            Py_INCREF(hops);
            Py_INCREF(PyList_GET_ITEM(path, n - 1));
            Py_INCREF(arrival);
            PyTuple_SET_ITEM(d, 0, first);
            PyTuple_SET_ITEM(d, 1, hops);
            PyTuple_SET_ITEM(d, 2, PyList_GET_ITEM(path, n - 1));
            PyTuple_SET_ITEM(d, 3, arrival);
        }
    }
done:
    Py_XDECREF(arrival);
    Py_XDECREF(first);
    Py_DECREF(hops);
    return d;
}

/* protect._edges_of, each edge's users gaining key (the by-edge index). */
static int index_edges(PyObject *by_edge, PyObject *start, PyObject *d, PyObject *key) {
    PyObject *transit = PyTuple_GET_ITEM(d, 1), *a = start;
    Py_ssize_t n = PyTuple_GET_SIZE(transit);
    for (Py_ssize_t i = 0; i <= n; i++) {
        PyObject *b = i < n ? PyTuple_GET_ITEM(PyTuple_GET_ITEM(transit, i), 0) : PyTuple_GET_ITEM(d, 2);
        PyObject *e = ordered_pair(a, b);
        if (!e) return -1;
        PyObject *users = PyDict_GetItemWithError(by_edge, e);
        int rc;
        if (users) {
            rc = PySet_Add(users, key);
        } else if (PyErr_Occurred()) {
            rc = -1;
        } else {
            PyObject *fresh = PySet_New(NULL);
            rc = fresh ? PySet_Add(fresh, key) : -1;
            if (rc == 0) rc = PyDict_SetItem(by_edge, e, fresh);
            Py_XDECREF(fresh);
        }
        Py_DECREF(e);
        if (rc < 0) return -1;
        a = b;
    }
    return 0;
}

/* The path around link end key (dpid, port) to its far end, from the pair's cache or a
 * search (one per link, from its lower dpid), or from the dropped detour's hint. New
 * reference; Py_None when there is none. */
static PyObject *path_for(PyObject *detours, PyObject *nbr, PyObject *key, PyObject *dpid, PyObject *far) {
    PyObject *hints = PyObject_GetAttr(detours, str_hint), *hint = NULL, *path = NULL;
    if (!hints) return NULL;
    if (!PyDict_Check(hints)) {
        PyErr_SetString(PyExc_TypeError, "detour_miss: _hint must be a dict");
        goto done;
    }
    if (PyDict_GET_SIZE(hints)) {
        hint = PyDict_GetItemWithError(hints, key);
        if (!hint && PyErr_Occurred()) goto done;
        if (hint) {
            Py_INCREF(hint);
            if (PyDict_DelItem(hints, key) < 0) goto done;
        }
    }
    if (hint && hint != Py_None) {
        PyObject *argv[4] = {nbr, dpid, far, hint};
        path = path_around(NULL, argv, 4);
        goto done;
    }
    PyObject *pair = ordered_pair(dpid, far), *pairs = NULL, *around = NULL;
    if (pair) pairs = PyObject_GetAttr(detours, str_pair);
    if (pairs && PyObject_SetItem(pairs, key, pair) == 0) around = PyObject_GetAttr(detours, str_around);
    if (around) {
        path = PyDict_Check(around) ? PyDict_GetItemWithError(around, pair) : NULL;
        if (path) {
            Py_INCREF(path);
        } else if (!PyErr_Occurred()) {
            if (!PyDict_Check(around)) {
                PyErr_SetString(PyExc_TypeError, "detour_miss: _around must be a dict");
            } else {
                PyObject *argv[4] = {nbr, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), Py_None};
                path = path_around(NULL, argv, 4);
                if (path && PyDict_SetItem(around, pair, path) < 0) Py_CLEAR(path);
            }
        }
    }
    Py_XDECREF(around);
    Py_XDECREF(pairs);
    Py_XDECREF(pair);
done:
    Py_XDECREF(hint);
    Py_DECREF(hints);
    return path;
}

static PyObject *detour_miss(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_CheckExact(args[3]) || PyTuple_GET_SIZE(args[3]) != 3 ||
        !PyType_Check(PyTuple_GET_ITEM(args[3], 2))) {
        PyErr_SetString(PyExc_TypeError, "detour_miss(detours, dpid, port, (MAX_PORT, MAX_TAG_DPID, Detour))");
        return NULL;
    }
    PyObject *detours = args[0], *dpid = args[1], *port = args[2];
    unsigned long long max_port = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args[3], 0));
    unsigned long long max_dpid = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args[3], 1));
    PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(args[3], 2);
    if (PyErr_Occurred()) return NULL;
    PyObject *key = PyTuple_Pack(2, dpid, port), *view = NULL, *port_link = NULL, *link = NULL, *far = NULL,
             *nbr = NULL, *path = NULL, *d = NULL, *result = NULL;
    if (!key) return NULL;
    view = PyObject_GetAttr(detours, str_view_attr);
    port_link = view ? PyObject_GetAttr(view, str_port_link) : NULL;
    if (!port_link) goto done;
    link = PyObject_GetItem(port_link, key);
    if (!link) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) goto done;
        PyErr_Clear();
    }
    if (link) {
        far = PyObject_CallMethodObjArgs(link, str_far_end, dpid, port, NULL);
        if (!far) goto done;
    }
    if (far && far != Py_None) {
        /* protectable(dpid, port), and the far end's port fits a 16-bit resubmit */
        int overflow = 0;
        long long dv = PyLong_AsLongLongAndOverflow(dpid, &overflow);
        long long pv = overflow ? 0 : PyLong_AsLongLongAndOverflow(port, &overflow);
        if ((dv == -1 || pv == -1) && PyErr_Occurred()) goto done;
        int ok = !overflow && dv > 0 && (unsigned long long)dv <= max_dpid && pv > 0 &&
                 (unsigned long long)pv <= max_port;
        if (ok) {
            PyObject *far_port = PyObject_CallMethodObjArgs(link, str_port_of, far, NULL);
            if (!far_port) goto done;
            long long fp = PyLong_AsLongLongAndOverflow(far_port, &overflow);
            Py_DECREF(far_port);
            if (fp == -1 && PyErr_Occurred()) goto done;
            ok = !overflow && fp <= (long long)max_port;
        }
        if (ok) {
            nbr = PyObject_GetAttr(view, str_nbr_ports);
            path = nbr ? path_for(detours, nbr, key, dpid, far) : NULL;
            if (!path) goto done;
            if (path != Py_None) {
                if (!PyList_Check(path) || PyList_GET_SIZE(path) < 2) {
                    PyErr_SetString(PyExc_TypeError, "detour_miss: a path must be a list of switches");
                    goto done;
                }
                int fwd = PyObject_RichCompareBool(PyList_GET_ITEM(path, 0), dpid, Py_EQ);
                if (fwd < 0) goto done;
                PyObject *along = fwd ? (Py_INCREF(path), path) : PyList_GetSlice(path, 0, PY_SSIZE_T_MAX);
                if (along && !fwd && PyList_Reverse(along) < 0) Py_CLEAR(along);
                if (!along) goto done;
                d = detour_along(nbr, along, type);
                Py_DECREF(along);
                if (!d) goto done;
            }
        }
    }
    if (!d) {
        d = Py_None;
        Py_INCREF(d);
    }
    PyObject *paths = PyObject_GetAttr(detours, str_paths);
    int rc = paths ? PyObject_SetItem(paths, key, d) : -1;
    Py_XDECREF(paths);
    if (rc < 0) goto done;
    if (d == Py_None) {
        PyObject *none = PyObject_GetAttr(detours, str_none);
        rc = none ? (PySet_Check(none) ? PySet_Add(none, key) : -1) : -1;
        if (none && rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "detour_miss: _none must be a set");
        Py_XDECREF(none);
    } else {
        PyObject *by_edge = PyObject_GetAttr(detours, str_by_edge);
        rc = by_edge ? (PyDict_Check(by_edge) ? index_edges(by_edge, dpid, d, key) : -1) : -1;
        if (by_edge && rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "detour_miss: _by_edge must be a dict");
        Py_XDECREF(by_edge);
    }
    if (rc < 0) goto done;
    result = d;
    d = NULL;
done:
    Py_XDECREF(d);
    Py_XDECREF(path);
    Py_XDECREF(nbr);
    Py_XDECREF(far);
    Py_XDECREF(link);
    Py_XDECREF(port_link);
    Py_XDECREF(view);
    Py_DECREF(key);
    return result;
}

/* bytes pre + port (32 bits, big-endian) + mid (NULL: none) + post */
static PyObject *sandwich(PyObject *pre, PyObject *port, PyObject *mid, PyObject *post) {
    char be[4];
    if (be32_of(port, be) < 0) return NULL;
    return join4(pre, be, 4, mid != NULL ? mid : post, mid != NULL ? post : NULL);
}

/* The ports of an entry's tuple as C longs (at most MAX_DIFF_PORTS: diff_one hands larger
 * switches to Python). */
#define MAX_DIFF_PORTS 64
static int longs_of(PyObject *t, long *out, Py_ssize_t *n) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > MAX_DIFF_PORTS) {
        PyErr_SetString(PyExc_ValueError, "diff_switches: an entry's ports are a tuple of at most 64");
        return -1;
    }
    *n = PyTuple_GET_SIZE(t);
    for (Py_ssize_t i = 0; i < *n; i++)
        if (get_long(PyTuple_GET_ITEM(t, i), &out[i]) < 0) return -1;
    return 0;
}

static int has_long(const long *a, Py_ssize_t n, long x) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

static int entry_ok(PyObject *e) {
    if (e == NULL) return 1;
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(e, 1)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(e, 2)) || !PyTuple_Check(PyTuple_GET_ITEM(e, 3)) ||
        (PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) != 0 && PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3)) != 3)) {
        PyErr_SetString(PyExc_TypeError, "an entry is (in_port, out_ports, ff, rejoin)");
        return 0;
    }
    return 1;
}

typedef struct {
    PyObject *gid, *parts, *rejoin_flow, *tags, *make_tag;
    unsigned long gidv;
    Rejoins *rejoins;  /* (its rejoin flows' bytes: rejoin_pair) */
} Group_;

/* A rejoin flow's add (detour_flow) or delete (detour_flow_delete) for rejoin
 * (arrival, tag, acts), appended to lst. */
static int put_rejoin(PyObject *lst, const Group_ *g, PyObject *dpid, PyObject *rejoin, int delete) {
    char match[14];
    PyObject *wire = NULL;
    if (rejoin_match(g->tags, g->make_tag, rejoin, match) < 0) return -1;
    if (delete) {
        wire = join4(PyTuple_GET_ITEM(g->parts, 4), match, 14, PyTuple_GET_ITEM(g->parts, 5), NULL);
    } else {
        PyObject *ht = rejoin_pair(g->rejoins, PyTuple_GET_ITEM(rejoin, 2));
        if (ht != NULL) wire = join4(PyTuple_GET_ITEM(ht, 0), match, 14, PyTuple_GET_ITEM(ht, 1), NULL);
        Py_XDECREF(ht);
    }
    return put_msg(lst, &flow_slots, dpid, wire);
}

/* The (S,G) flow add (head + in_port + tail: parts 0, 1) or delete (parts 2, 3). */
static int put_sg(PyObject *lst, const Group_ *g, PyObject *dpid, PyObject *in_port, int delete) {
    return put_msg(lst, &flow_slots, dpid,
                   sandwich(PyTuple_GET_ITEM(g->parts, delete ? 2 : 0), in_port, NULL,
                            PyTuple_GET_ITEM(g->parts, delete ? 3 : 1)));
}

static int put_group(PyObject *lst, const Group_ *g, PyObject *dpid, unsigned command, PyObject *in_port,
                     PyObject *out_ports, PyObject *ff) {
    return put_msg(lst, &group_slots, dpid, group_wire(command, g->gidv, in_port, out_ports, ff, 1));
}

/* A tuple of n C longs (new reference). */
static PyObject *tuple_of(const long *a, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(a[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* One switch from old to new (one of them may be NULL): _diff_one's messages, or -2 when
 * its tree turns around there, or it has more than MAX_DIFF_PORTS ports in the tree (the
 * caller asks _diff_one; nothing was sent for it here). */
static int diff_one(const Group_ *g, PyObject *dpid, PyObject *old, PyObject *new, PyObject *build,
                    PyObject *swtch, PyObject *cut, PyObject *remove, long unknown) {
    if (old == NULL) {
        PyObject *in_port = PyTuple_GET_ITEM(new, 0);
        if (put_group(build, g, dpid, OFPGC_ADD, in_port, PyTuple_GET_ITEM(new, 1), PyTuple_GET_ITEM(new, 2)) < 0 ||
            put_sg(build, g, dpid, in_port, 0) < 0)
            return -1;
        return PyTuple_GET_SIZE(PyTuple_GET_ITEM(new, 3)) ? put_rejoin(build, g, dpid, PyTuple_GET_ITEM(new, 3), 0) : 0;
    }
    if (new == NULL) {
        if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(old, 3)) && put_rejoin(remove, g, dpid, PyTuple_GET_ITEM(old, 3), 1) < 0)
            return -1;
        return put_msg(remove, &group_slots, dpid, Py_NewRef(PyTuple_GET_ITEM(g->parts, 6)));
    }
    if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(old, 1)) > MAX_DIFF_PORTS ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(new, 1)) > MAX_DIFF_PORTS ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(old, 2)) > MAX_DIFF_PORTS ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(new, 2)) > MAX_DIFF_PORTS)
        return -2;  /* (a switch with more ports in the tree than the arrays here: _diff_one's) */
    long o_out[MAX_DIFF_PORTS], n_out[MAX_DIFF_PORTS], o_in, n_in;
    Py_ssize_t no, nn;
    PyObject *new_in = PyTuple_GET_ITEM(new, 0), *new_out = PyTuple_GET_ITEM(new, 1), *new_ff = PyTuple_GET_ITEM(new, 2);
    PyObject *old_ff = PyTuple_GET_ITEM(old, 2), *o_rj = PyTuple_GET_ITEM(old, 3), *n_rj = PyTuple_GET_ITEM(new, 3);
    if (get_long(PyTuple_GET_ITEM(old, 0), &o_in) < 0 || get_long(new_in, &n_in) < 0 ||
        longs_of(PyTuple_GET_ITEM(old, 1), o_out, &no) < 0 || longs_of(new_out, n_out, &nn) < 0)
        return -1;
    int same_out = PyObject_RichCompareBool(new_out, PyTuple_GET_ITEM(old, 1), Py_EQ);
    int same_ff = same_out < 0 ? -1 : PyObject_RichCompareBool(new_ff, old_ff, Py_EQ);
    if (same_ff < 0) return -1;
    int in_moved = n_in != o_in;
    if (!same_out || !same_ff || (in_moved && (has_long(n_out, nn, n_in) || has_long(o_out, no, n_in)))) {
        int superset = 1;  /* set(new.out_ports) >= set(old.out_ports) */
        for (Py_ssize_t i = 0; i < no && superset; i++) superset = has_long(n_out, nn, o_out[i]);
        if (superset) {
            if (put_group(swtch, g, dpid, OFPGC_MODIFY, new_in, new_out, new_ff) < 0) return -1;
        } else {
            long both[2 * MAX_DIFF_PORTS];
            Py_ssize_t nb = 0;
            for (Py_ssize_t i = 0; i < no + nn; i++) {  /* sorted union (insertion) */
                long q = i < no ? o_out[i] : n_out[i - no];
                if (has_long(both, nb, q)) continue;
                Py_ssize_t at = nb++;
                for (; at > 0 && both[at - 1] > q; at--) both[at] = both[at - 1];
                both[at] = q;
            }
            if (nb == no) {
                if (put_group(cut, g, dpid, OFPGC_MODIFY, new_in, new_out, new_ff) < 0) return -1;
            } else if (!in_moved || (!has_long(both, nb, o_in) && !has_long(both, nb, n_in))) {
                /* copies to both meanwhile: the new FF ids, then the old ones of ports it drops,
                 * in port order (a stable sort) */
                Py_ssize_t nf = PyTuple_GET_SIZE(new_ff), of = PyTuple_GET_SIZE(old_ff), k = 0;
                long ffs[2 * MAX_DIFF_PORTS];
                if (nf + of > 2 * MAX_DIFF_PORTS) {
                    PyErr_SetString(PyExc_ValueError, "diff_switches: too many FF groups");
                    return -1;
                }
                for (Py_ssize_t i = 0; i < nf + of; i++) {
                    long f;
                    if (get_long(PyTuple_GET_ITEM(i < nf ? new_ff : old_ff, i < nf ? i : i - nf), &f) < 0) return -1;
                    if (i >= nf && has_long(n_out, nn, f & MAX_PORT)) continue;
                    Py_ssize_t at = k++;
                    for (; at > 0 && (ffs[at - 1] & MAX_PORT) > (f & MAX_PORT); at--) ffs[at] = ffs[at - 1];
                    ffs[at] = f;
                }
                PyObject *both_t = tuple_of(both, nb), *ffs_t = both_t ? tuple_of(ffs, k) : NULL;
                int rc = ffs_t == NULL ? -1 : put_group(swtch, g, dpid, OFPGC_MODIFY, new_in, both_t, ffs_t);
                Py_XDECREF(both_t);
                Py_XDECREF(ffs_t);
                if (rc < 0 || put_group(cut, g, dpid, OFPGC_MODIFY, new_in, new_out, new_ff) < 0) return -1;
            } else {
                return -2;  /* the ingress turns onto a port it copied to (or back) */
            }
        }
    }
    if (in_moved && put_sg(build, g, dpid, new_in, 0) < 0) return -1;
    if (in_moved && o_in != unknown && put_sg(remove, g, dpid, PyTuple_GET_ITEM(old, 0), 1) < 0) return -1;
    int same_rj = PyObject_RichCompareBool(n_rj, o_rj, Py_EQ);
    if (same_rj < 0) return -1;
    if (!same_rj) {
        int moved = !PyTuple_GET_SIZE(o_rj);
        if (!moved && PyTuple_GET_SIZE(n_rj)) {  /* old.rejoin[:2] != new.rejoin[:2] */
            int a = PyObject_RichCompareBool(PyTuple_GET_ITEM(o_rj, 0), PyTuple_GET_ITEM(n_rj, 0), Py_EQ);
            int b = a <= 0 ? a : PyObject_RichCompareBool(PyTuple_GET_ITEM(o_rj, 1), PyTuple_GET_ITEM(n_rj, 1), Py_EQ);
            if (a < 0 || b < 0) return -1;
            moved = !(a && b);
        } else if (!moved) {
            moved = 1;  /* (new has none: old[:2] != ()) */
        }
        if (PyTuple_GET_SIZE(n_rj) && put_rejoin(moved ? build : swtch, g, dpid, n_rj, 0) < 0) return -1;
        if (PyTuple_GET_SIZE(o_rj) && moved && put_rejoin(remove, g, dpid, o_rj, 1) < 0) return -1;
    }
    return 0;
}

/* diff_switches(gid, changed, have, want, installed, placed, changes, build, switch, cut,
 *               remove, parts, rejoin_flow, tags, make_tag, one, flow_cls, group_cls, unknown)
 * MulticastCore._diff_switches_py's loop (see there), the messages packed here from the
 * group's parts (ofmsgs.diff_parts), its rejoin flows' (rejoin_flow(acts)) and the tags'
 * TLVs (rejoin_match), as tree_adds packs a new tree's; a switch whose tree turns around
 * is one(dpid, old, new)'s. */
static PyObject *diff_switches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "diff_switches takes 19 arguments");
        return NULL;
    }
    PyObject *changed = args[1], *have = args[2], *want = args[3], *installed = args[4], *placed = args[5],
             *changes = args[6], *build = args[7], *swtch = args[8], *cut = args[9], *remove = args[10], *one = args[15];
    Rejoins rjs = {args[12], 0, 0, NULL, NULL, NULL};
    Group_ g = {args[0], args[11], args[12], args[13], args[14], 0, &rjs};
    long gidv, unknown;
    if (!PyList_Check(changed) || !PyDict_Check(have) || !PyDict_Check(want) || !PyDict_Check(installed) ||
        !PyDict_Check(placed) || !PyList_Check(build) || !PyList_Check(swtch) || !PyList_Check(cut) ||
        !PyList_Check(remove) || !PyTuple_Check(g.parts) || PyTuple_GET_SIZE(g.parts) != 7 || !PyDict_Check(g.tags)) {
        PyErr_SetString(PyExc_TypeError, "diff_switches: changed and the phases are lists, have, want, installed, "
                                         "placed and tags dicts, parts a 7-tuple");
        return NULL;
    }
    for (int i = 0; i < 7; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(g.parts, i))) {
            PyErr_SetString(PyExc_TypeError, "diff_switches: parts are bytes");
            return NULL;
        }
    if (get_long(args[0], &gidv) < 0 || get_long(args[18], &unknown) < 0) return NULL;
    if (gidv < 0 || gidv > 0xFFFFFFFFL) {
        PyErr_SetString(PyExc_OverflowError, "a group id is 32 bits");
        return NULL;
    }
    g.gidv = rjs.gid = (unsigned long)gidv;
    if (slots_for(args[16], &flow_slots) < 0 || slots_for(args[17], &group_slots) < 0) return NULL;
    PyObject *step = PyLong_FromLong(1);
    if (step == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(changed); i++) {
        PyObject *dpid = PyList_GET_ITEM(changed, i), *old, *new, *count, *more;
        Py_INCREF(dpid);
        int rc = -1;
        old = PyDict_GetItemWithError(have, dpid);
        new = old == NULL && PyErr_Occurred() ? NULL : PyDict_GetItemWithError(want, dpid);
        if (PyErr_Occurred()) goto next;
        Py_XINCREF(old);
        Py_XINCREF(new);
        if (old == Py_None) Py_CLEAR(old);  /* (None believed: as absent) */
        if (new == Py_None) Py_CLEAR(new);
        if (!entry_ok(old) || !entry_ok(new)) goto next;
        if (old == NULL && new == NULL) {
            PyErr_SetObject(PyExc_KeyError, dpid);
            goto next;
        }
        if ((count = PyObject_GetItem(changes, dpid)) == NULL) goto next;  /* (changes[dpid] += 1) */
        more = PyNumber_Add(count, step);
        Py_DECREF(count);
        if (more == NULL) goto next;
        int set = PyObject_SetItem(changes, dpid, more);
        Py_DECREF(more);
        if (set < 0) goto next;
        int got = diff_one(&g, dpid, old, new, build, swtch, cut, remove, unknown);
        if (got == -2) {  /* (a turn: nothing sent for it yet) */
            PyObject *r = PyObject_CallFunctionObjArgs(one, dpid, old ? old : Py_None, new ? new : Py_None, NULL);
            got = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        if (got < 0) goto next;
        PyObject *at = PyDict_GetItemWithError(installed, dpid);
        if (at == NULL || !PyDict_Check(at)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "diff_switches: a switch not in installed");
            goto next;
        }
        if (new == NULL) {  /* installed[dpid].pop(gid, None); placed.pop(dpid, None) */
            int has = PyDict_Contains(at, args[0]);
            if (has < 0 || (has && PyDict_DelItem(at, args[0]) < 0)) goto next;
            has = PyDict_Contains(placed, dpid);
            if (has < 0 || (has && PyDict_DelItem(placed, dpid) < 0)) goto next;
        } else if (PyDict_SetItem(at, args[0], new) < 0 || PyDict_SetItem(placed, dpid, Py_None) < 0) {
            goto next;
        }
        rc = 0;
    next:
        Py_XDECREF(old);
        Py_XDECREF(new);
        Py_DECREF(dpid);
        if (rc < 0) {
            Py_DECREF(step);
            rejoins_clear(&rjs);
            return NULL;
        }
    }
    Py_DECREF(step);
    rejoins_clear(&rjs);
    Py_RETURN_NONE;
}

typedef struct {
    long depth;
    Py_ssize_t at;
} ByDepth;

static int by_depth(const void *a, const void *b) {  /* deepest first, then as they were */
    const ByDepth *x = a, *y = b;
    if (x->depth != y->depth) return x->depth > y->depth ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* -- the shared protection entries' diff ------------------------------------------------
 * diff_shared(items, want_of, have_of, changes, adds, removes, absent, make, parts,
 *             flow_cls, group_cls): MulticastCore._diff_shared_py's loop (see there).
 * items: (dpid, keys) in order. A new tree's first use of ~4000 protected links on
 * fat-tree:16 wants ~16,000 of these entries (a link's FF groups, its detour's transit
 * flows), ~1.5 us each in Python. The two usual shapes are packed here from templates
 * that Python built with its own builders (ofmsgs.shared_parts: the bytes with zeros
 * where the values go, and those places): a transit flow's add, an FF group's add or
 * modify of protect.ff_buckets's shape. Anything else (a removal, a rejoin, another
 * shape, a value out of range) is make(dpid, key, want, have)'s. */
static PyObject *str_transit, *str_ff, *str_set_field, *str_eth_dst;  /* (the kinds' and actions' names) */

typedef struct {
    PyObject *transit_wire, *ff_wire;
    Py_ssize_t transit_at[3], ff_at[7];
    unsigned modify;
} SharedParts;

static int same_str(PyObject *o, PyObject *name) {
    if (o == name) return 1;
    return PyUnicode_CheckExact(o) && PyUnicode_Compare(o, name) == 0;
}

/* 1 and *v when o is an int of 32 bits, else 0 (no error: the caller hands it to Python). */
static int u32_in(PyObject *o, unsigned long *v) {
    if (!PyLong_Check(o)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || x < 0 || x > 0xFFFFFFFFLL) {
        if (x == -1 && PyErr_Occurred()) PyErr_Clear();
        return 0;
    }
    *v = (unsigned long)x;
    return 1;
}

/* 1 and the port when a is ("output", port of 32 bits). */
static int output_in(PyObject *a, unsigned long *port) {
    return PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 2 && same_str(PyTuple_GET_ITEM(a, 0), str_output) &&
           u32_in(PyTuple_GET_ITEM(a, 1), port);
}

static int parts_of(PyObject *parts, SharedParts *sp) {
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 5) goto bad;
    PyObject **p = &PyTuple_GET_ITEM(parts, 0);
    sp->transit_wire = p[0], sp->ff_wire = p[2];
    if (!PyBytes_Check(p[0]) || !PyBytes_Check(p[2]) || !PyTuple_Check(p[1]) || PyTuple_GET_SIZE(p[1]) != 3 ||
        !PyTuple_Check(p[3]) || PyTuple_GET_SIZE(p[3]) != 7)
        goto bad;
    static const int width[10] = {4, 6, 4, 2, 4, 4, 4, 4, 6, 4};  /* (what shared_wire writes there) */
    for (int i = 0; i < 10; i++) {
        PyObject *t = i < 3 ? p[1] : p[3];
        Py_ssize_t *at = i < 3 ? &sp->transit_at[i] : &sp->ff_at[i - 3];
        Py_ssize_t size = PyBytes_GET_SIZE(i < 3 ? p[0] : p[2]);
        long v;
        if (get_long(PyTuple_GET_ITEM(t, i < 3 ? i : i - 3), &v) < 0) return -1;
        if (v < 0 || v + width[i] > size) goto bad;
        *at = v;
    }
    long modify;
    if (get_long(p[4], &modify) < 0) return -1;
    if (modify < 0 || modify > 0xFFFF) goto bad;
    sp->modify = (unsigned)modify;
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "diff_shared: parts are (transit wire, its 3 places, ff wire, its 7 places, "
                                     "modify)");
    return -1;
}

static PyObject *patched(PyObject *wire) {
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(wire), PyBytes_GET_SIZE(wire));
}

/* The wire of an add of key with want w (h_absent: nothing there yet) when it has one of
 * the usual shapes; NULL without an error otherwise. */
static PyObject *shared_wire(const SharedParts *sp, PyObject *key, PyObject *w, int h_absent) {
    if (!PyTuple_Check(key) || !PyTuple_Check(w)) return NULL;
    unsigned long a, b, c, d;
    char tlv[10];
    if (PyTuple_GET_SIZE(key) == 3 && same_str(PyTuple_GET_ITEM(key, 0), str_transit)) {
        /* ("transit", in_port, tag) -> (("output", port),) */
        if (!u32_in(PyTuple_GET_ITEM(key, 1), &a) || !mac_tlv_into(PyTuple_GET_ITEM(key, 2), tlv) ||
            PyTuple_GET_SIZE(w) != 1 || !output_in(PyTuple_GET_ITEM(w, 0), &b))
            return NULL;
        PyObject *out = patched(sp->transit_wire);
        if (out == NULL) return NULL;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
        put32(p + sp->transit_at[0], a);
        memcpy(p + sp->transit_at[1], tlv + 4, 6);
        put32(p + sp->transit_at[2], b);
        return out;
    }
    if (PyTuple_GET_SIZE(key) != 2 || !same_str(PyTuple_GET_ITEM(key, 0), str_ff) || PyTuple_GET_SIZE(w) != 2)
        return NULL;
    /* ("ff", id) -> ((watch, (("output", port),)), (watch, (("set_field", "eth_dst", tag), ("output", port)))) */
    PyObject *b1 = PyTuple_GET_ITEM(w, 0), *b2 = PyTuple_GET_ITEM(w, 1), *acts1, *acts2, *set;
    unsigned long gid;
    if (!u32_in(PyTuple_GET_ITEM(key, 1), &gid) || !PyTuple_Check(b1) || PyTuple_GET_SIZE(b1) != 2 ||
        !PyTuple_Check(b2) || PyTuple_GET_SIZE(b2) != 2 || !u32_in(PyTuple_GET_ITEM(b1, 0), &a) ||
        !u32_in(PyTuple_GET_ITEM(b2, 0), &c))
        return NULL;
    acts1 = PyTuple_GET_ITEM(b1, 1), acts2 = PyTuple_GET_ITEM(b2, 1);
    if (!PyTuple_Check(acts1) || PyTuple_GET_SIZE(acts1) != 1 || !output_in(PyTuple_GET_ITEM(acts1, 0), &b) ||
        !PyTuple_Check(acts2) || PyTuple_GET_SIZE(acts2) != 2 || !output_in(PyTuple_GET_ITEM(acts2, 1), &d))
        return NULL;
    set = PyTuple_GET_ITEM(acts2, 0);
    if (!PyTuple_Check(set) || PyTuple_GET_SIZE(set) != 3 || !same_str(PyTuple_GET_ITEM(set, 0), str_set_field) ||
        !same_str(PyTuple_GET_ITEM(set, 1), str_eth_dst) || !mac_tlv_into(PyTuple_GET_ITEM(set, 2), tlv))
        return NULL;
    PyObject *out = patched(sp->ff_wire);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    put16(p + sp->ff_at[0], h_absent ? OFPGC_ADD : sp->modify);
    put32(p + sp->ff_at[1], gid);
    put32(p + sp->ff_at[2], a);
    put32(p + sp->ff_at[3], b);
    put32(p + sp->ff_at[4], c);
    memcpy(p + sp->ff_at[5], tlv + 4, 6);
    put32(p + sp->ff_at[6], d);
    return out;
}

/* (dpid, make(dpid, key, w, h)) appended to lst. */
static int put_made(PyObject *lst, PyObject *make, PyObject *dpid, PyObject *key, PyObject *w, PyObject *h) {
    PyObject *m = PyObject_CallFunctionObjArgs(make, dpid, key, w, h, NULL);
    if (m == NULL) return -1;
    PyObject *pair = PyTuple_Pack(2, dpid, m);
    Py_DECREF(m);
    if (pair == NULL) return -1;
    int rc = PyList_Append(lst, pair);
    Py_DECREF(pair);
    return rc;
}

/* One switch's keys: have brought to want, the messages appended; 1 when one changed. */
static int diff_shared_at(const SharedParts *sp, PyObject *dpid, PyObject *keys, PyObject *want, PyObject *have,
                          PyObject *adds, PyObject *removes, PyObject *absent, PyObject *make) {
    PyObject *order = PySequence_List(keys);
    if (order == NULL || PyList_Sort(order) < 0) {
        Py_XDECREF(order);
        return -1;
    }
    int changed = 0, rc = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order) && rc == 0; i++) {
        PyObject *key = PyList_GET_ITEM(order, i), *w = NULL, *h;
        if (want != NULL && (w = PyDict_GetItemWithError(want, key)) == NULL && PyErr_Occurred()) {
            rc = -1;
            break;
        }
        w = w != NULL ? w : absent;
        Py_INCREF(w);  /* (held before the next lookup: a key's comparison may run Python) */
        if ((h = PyDict_GetItemWithError(have, key)) == NULL && PyErr_Occurred()) {
            Py_DECREF(w);
            rc = -1;
            break;
        }
        h = h != NULL ? h : absent;
        Py_INCREF(h);
        int eq = PyObject_RichCompareBool(w, h, Py_EQ);
        if (eq != 0) {
            rc = eq < 0 ? -1 : 0;
        } else {
            changed = 1;
            if (w == absent) {
                rc = PyDict_DelItem(have, key) < 0 || put_made(removes, make, dpid, key, w, h) < 0 ? -1 : 0;
            } else if (PyDict_SetItem(have, key, w) < 0) {
                rc = -1;
            } else {
                int is_ff = PyTuple_Check(key) && PyTuple_GET_SIZE(key) == 2;
                PyObject *wire = shared_wire(sp, key, w, h == absent);
                if (wire != NULL)
                    rc = put_msg(adds, is_ff ? &group_slots : &flow_slots, dpid, wire);
                else
                    rc = PyErr_Occurred() || put_made(adds, make, dpid, key, w, h) < 0 ? -1 : 0;
            }
        }
        Py_DECREF(w);
        Py_DECREF(h);
    }
    Py_DECREF(order);
    return rc < 0 ? -1 : changed;
}

static PyObject *diff_shared(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "diff_shared takes 11 arguments");
        return NULL;
    }
    PyObject *items = args[0], *want_of = args[1], *have_of = args[2], *changes = args[3], *adds = args[4],
             *removes = args[5], *absent = args[6], *make = args[7];
    SharedParts sp;
    if (!PyList_Check(items) || !PyDict_Check(want_of) || !PyDict_Check(have_of) || !PyList_Check(adds) ||
        !PyList_Check(removes)) {
        PyErr_SetString(PyExc_TypeError, "diff_shared: items, adds and removes are lists, want_of and have_of dicts");
        return NULL;
    }
    if (parts_of(args[8], &sp) < 0 || slots_for(args[9], &flow_slots) < 0 || slots_for(args[10], &group_slots) < 0)
        return NULL;
    PyObject *step = PyLong_FromLong(1);
    if (step == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *dpid, *want, *have, *count = NULL, *more = NULL;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "diff_shared: items are (dpid, keys)");
            goto fail;
        }
        Py_INCREF(item);  /* (held: make and the comparisons run Python) */
        dpid = PyTuple_GET_ITEM(item, 0);
        int rc = -1;
        want = PyDict_GetItemWithError(want_of, dpid);  /* want_of.get(dpid, {}) */
        if (want == NULL && PyErr_Occurred()) goto next;
        if (want != NULL && !PyDict_Check(want)) {
            PyErr_SetString(PyExc_TypeError, "diff_shared: want_of holds dicts");
            goto next;
        }
        Py_XINCREF(want);
        have = PyDict_GetItemWithError(have_of, dpid);  /* have_of.setdefault(dpid, {}) */
        if (have != NULL) {
            Py_INCREF(have);
        } else if (!PyErr_Occurred() && (have = PyDict_New()) != NULL && PyDict_SetItem(have_of, dpid, have) < 0) {
            Py_CLEAR(have);
        }
        if (have != NULL && !PyDict_Check(have)) {
            PyErr_SetString(PyExc_TypeError, "diff_shared: have_of holds dicts");
        } else if (have != NULL) {
            int changed = diff_shared_at(&sp, dpid, PyTuple_GET_ITEM(item, 1), want, have, adds, removes, absent, make);
            if (changed == 0) {
                rc = 0;
            } else if (changed > 0 && (count = PyObject_GetItem(changes, dpid)) != NULL &&  /* changes[dpid] += 1 */
                       (more = PyNumber_Add(count, step)) != NULL && PyObject_SetItem(changes, dpid, more) == 0) {
                rc = 0;
            }
        }
        Py_XDECREF(want);
        Py_XDECREF(have);
    next:
        Py_XDECREF(count);
        Py_XDECREF(more);
        Py_DECREF(item);
        if (rc < 0) goto fail;
    }
    Py_DECREF(step);
    Py_RETURN_NONE;
fail:
    Py_DECREF(step);
    return NULL;
}

/* changed_of(dpids, placed, installed, gid, want, parent) -> (changed, have):
 * MulticastCore._changed_py (see there). */
static PyObject *changed_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyAnySet_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyDict_Check(args[4]) || (args[5] != Py_None && !PyDict_Check(args[5]))) {
        PyErr_SetString(PyExc_TypeError, "changed_of(dpids: set, placed: dict, installed: dict, gid, want: dict, "
                                         "parent: dict | None)");
        return NULL;
    }
    PyObject *dpids = args[0], *placed = args[1], *installed = args[2], *gid = args[3], *want = args[4],
             *parent = args[5], *have = PyDict_New(), *sorted = NULL, *changed = NULL, *result = NULL, *d;
    ByDepth *order = NULL;
    if (have == NULL) return NULL;
    PyObject *it = PyObject_GetIter(dpids);
    if (it == NULL) goto done;
    while ((d = PyIter_Next(it)) != NULL) {
        int has = PyDict_Contains(placed, d), rc = -1;
        if (has <= 0) {
            rc = has;
        } else {
            PyObject *at = PyDict_GetItemWithError(installed, d), *e = NULL;
            if (at != NULL && PyDict_Check(at)) e = PyDict_GetItemWithError(at, gid);
            if (e == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, at == NULL ? d : gid);
            } else {
                rc = PyDict_SetItem(have, d, e);
            }
        }
        Py_DECREF(d);
        if (rc < 0) {
            Py_DECREF(it);
            goto done;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) goto done;
    if ((sorted = PySequence_List(dpids)) == NULL || PyList_Sort(sorted) < 0 || (changed = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sorted); i++) {
        d = PyList_GET_ITEM(sorted, i);
        PyObject *h = PyDict_GetItemWithError(have, d), *w = h == NULL && PyErr_Occurred() ? NULL
                                                                                           : PyDict_GetItemWithError(want, d);
        if (PyErr_Occurred()) goto done;
        int differs = PyObject_RichCompareBool(h ? h : Py_None, w ? w : Py_None, Py_NE);
        if (differs < 0 || (differs && PyList_Append(changed, d) < 0)) goto done;
    }
    Py_ssize_t m = PyList_GET_SIZE(changed);
    if (parent != Py_None && m > 1) {
        if ((order = PyMem_Malloc(sizeof(ByDepth) * (size_t)m)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *n = PyList_GET_ITEM(changed, i);
            long k = 0;
            int in = PyDict_Contains(want, n);
            if (in < 0) goto done;
            while (in) {  /* (hops to the root) */
                PyObject *p = PyDict_GetItemWithError(parent, n);
                if (p == NULL && PyErr_Occurred()) goto done;
                if (p == NULL || p == Py_None) break;
                n = p;
                if (++k > PyDict_GET_SIZE(parent)) {
                    PyErr_SetString(PyExc_ValueError, "changed_of: the parent map has a cycle");
                    goto done;
                }
            }
            order[i].depth = k;
            order[i].at = i;
        }
        qsort(order, (size_t)m, sizeof(ByDepth), by_depth);
        PyObject *again = PyList_New(m);
        if (again == NULL) goto done;
        for (Py_ssize_t i = 0; i < m; i++) PyList_SET_ITEM(again, i, Py_NewRef(PyList_GET_ITEM(changed, order[i].at)));
        Py_SETREF(changed, again);
    }
    result = PyTuple_Pack(2, changed, have);
done:
    PyMem_Free(order);
    Py_XDECREF(sorted);
    Py_XDECREF(changed);
    Py_DECREF(have);
    return result;
}

/* -- a new tree's bookkeeping (MulticastCore._place_py's loops, see there) ------------ */

/* live_of(order, installed, switches) -> the switches of ``order`` in ``installed`` and in
 * ``switches``, in order. */
static PyObject *live_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyAnySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "live_of(order: list, installed: dict, switches: set)");
        return NULL;
    }
    PyObject *order = args[0], *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *d = PyList_GET_ITEM(order, i);
        Py_INCREF(d);
        int has = PyDict_Contains(args[1], d);
        if (has > 0) has = PySet_Contains(args[2], d);
        if (has > 0) has = PyList_Append(out, d) < 0 ? -1 : 1;
        Py_DECREF(d);
        if (has < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* note_placed(gid, todo, want, installed, changes): for each switch d of todo,
 * changes[d] += 1 and installed[d][gid] = want[d]. */
static PyObject *note_placed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[1]) || !PyDict_Check(args[2]) || !PyDict_Check(args[3]) ||
        !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "note_placed(gid, todo: list, want: dict, installed: dict, changes: dict)");
        return NULL;
    }
    PyObject *gid = args[0], *todo = args[1], *want = args[2], *installed = args[3], *changes = args[4];
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(todo); i++) {
        PyObject *d = PyList_GET_ITEM(todo, i), *count = NULL, *more = NULL;
        Py_INCREF(d);
        int rc = -1;
        count = PyDict_GetItemWithError(changes, d);  /* (changes[d] += 1; a defaultdict's miss: GetItem) */
        if (count != NULL)
            Py_INCREF(count);
        else if (!PyErr_Occurred())
            count = PyObject_GetItem(changes, d);
        if (count == NULL || (more = PyNumber_Add(count, one)) == NULL || PyObject_SetItem(changes, d, more) < 0)
            goto next;
        PyObject *e = PyDict_GetItemWithError(want, d);
        PyObject *at = e == NULL ? NULL : PyDict_GetItemWithError(installed, d);
        if (at == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, d);
            goto next;
        }
        if (!PyDict_Check(at)) {
            PyErr_SetString(PyExc_TypeError, "note_placed: installed holds dicts");
            goto next;
        }
        rc = PyDict_SetItem(at, gid, e);
    next:
        Py_XDECREF(count);
        Py_XDECREF(more);
        Py_DECREF(d);
        if (rc < 0) {
            Py_DECREF(one);
            return NULL;
        }
    }
    Py_DECREF(one);
    Py_RETURN_NONE;
}

/* -- a new tree's entries from its parent map ----------------------------------------
 * fill_tree(entries, parent, nbr, ends, source_port, uplinks, uplink, protect, pieces,
 *           piece, ff_refs, want_ff, guard, to_own, entry_type, in_port_out, shapes)
 * -> entries: outs (trees._outs) and fill in one call. Each switch's output ports (its
 * children's ports, nbr[switch][child], and its ends' ports) are gathered, sorted and
 * made a tuple in C arrays, by the switch's int value (Ids), instead of a Python list
 * per switch (~100 per new tree on fat-tree:16: making, sorting, converting and freeing
 * them). entries None: a dict sized for the tree, filled in parent's order, as
 * dict.fromkeys(outs) was. Anything else than ints as switches and ports, a parent or
 * end that is no switch of the tree, a port missing: outs and fill as before (the same
 * result, or their error). */
typedef struct {
    Py_ssize_t owner;
    long long v;
    PyObject *port; /* (a reference held) */
} PortRec;

/* fill_tree's arrays freed, the references they hold (the first held switches and their
 * parents, the first m records' ports) given back. */
static void fill_tree_free(Ids *ids, PyObject **node, PyObject **par, Py_ssize_t held, PortRec *rec, Py_ssize_t m,
                           Py_ssize_t *count) {
    ids_free(ids);
    for (Py_ssize_t i = 0; i < held; i++) {
        Py_DECREF(node[i]);
        Py_DECREF(par[i]);
    }
    for (Py_ssize_t r = 0; r < m; r++) Py_DECREF(rec[r].port);
    PyMem_Free(node);
    PyMem_Free(rec);
    PyMem_Free(count);
}

static PyObject *fill_tree(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "fill_tree takes 17 arguments");
        return NULL;
    }
    PyObject *entries = args[0], *parent = args[1], *nbr = args[2], *ends = args[3];
    Filling f;
    if (filling_of(args + 4, &f) < 0) return NULL;
    if ((entries != Py_None && !PyDict_Check(entries)) || !PyDict_Check(parent) || !PyDict_Check(nbr) ||
        !PyAnySet_Check(ends)) {
        PyErr_SetString(PyExc_TypeError, "fill_tree: entries a dict or None, parent and nbr dicts, ends a set");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(parent), m = 0, cap = n + PySet_GET_SIZE(ends);
    PyObject *out = entries == Py_None ? _PyDict_NewPresized(n) : (Py_INCREF(entries), entries);
    if (out == NULL) return NULL;
    Ids ids = {NULL, NULL, 0};
    PyObject **node = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n + 1) * 2);
    PortRec *rec = PyMem_Malloc(sizeof(PortRec) * (size_t)(cap + 1) * 2);
    /* count[o + 1]: how many ports switch o has, then where its ports start; next (after
     * it): where the next of them goes while they are placed */
    Py_ssize_t *count = PyMem_Calloc(2 * (size_t)n + 3, sizeof(Py_ssize_t));
    int fast = 1;
    Py_ssize_t held = 0;  /* (node[..held] and par[..held] hold references, as rec[..m] do) */
    PyObject **par = node != NULL ? node + n + 1 : NULL;
    PortRec *sorted = rec != NULL ? rec + cap + 1 : NULL;
    if (node == NULL || rec == NULL || count == NULL || ids_init(&ids, n) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *c, *p;
    while (PyDict_Next(parent, &pos, &c, &p)) {  /* each switch's number: its place in parent */
        size_t at;
        long long k = key_of(c, &fast);
        if (!fast || ids_find(&ids, k, &at) >= 0) {
            fast = 0;
            break;
        }
        ids.keys[at] = k;
        ids.slot[at] = i;
        Py_INCREF(c);  /* (held: the callbacks of fill_one run Python) */
        Py_INCREF(p);
        node[i] = c;
        par[i++] = p;
        held = i;
    }
    for (i = 0; fast && i < n; i++) {  /* the children's ports, at their parents */
        if (par[i] == Py_None) continue;
        size_t at;
        long long pk = key_of(par[i], &fast);
        PyObject *to = fast ? PyDict_GetItemWithError(nbr, par[i]) : NULL;
        PyObject *port = to != NULL && PyDict_Check(to) ? PyDict_GetItemWithError(to, node[i]) : NULL;
        if (PyErr_Occurred()) goto fail;
        Py_ssize_t owner = port != NULL ? ids_find(&ids, pk, &at) : -1;
        long long v = owner >= 0 ? key_of(port, &fast) : 0;
        if (owner < 0 || !fast) {
            fast = 0;
            break;
        }
        Py_INCREF(port);
        rec[m++] = (PortRec){owner, v, port};
        count[owner + 1]++;
    }
    pos = 0;
    PyObject *end;
    Py_hash_t hash;
    while (fast && _PySet_NextEntry(ends, &pos, &end, &hash)) {  /* the ends' ports */
        size_t at;
        Py_ssize_t owner = -1;
        long long v = 0;
        if (PyTuple_Check(end) && PyTuple_GET_SIZE(end) == 2) {
            long long k = key_of(PyTuple_GET_ITEM(end, 0), &fast);
            if (fast) owner = ids_find(&ids, k, &at);
            if (owner >= 0) v = key_of(PyTuple_GET_ITEM(end, 1), &fast);
        }
        if (owner < 0 || !fast || m >= cap) {
            fast = 0;
            break;
        }
        Py_INCREF(PyTuple_GET_ITEM(end, 1));
        rec[m++] = (PortRec){owner, v, PyTuple_GET_ITEM(end, 1)};
        count[owner + 1]++;
    }
    if (!fast) {  /* outs and fill, as before */
        PyObject *a[3] = {parent, nbr, ends};
        PyObject *o = outs(NULL, a, 3);
        int rc = o == NULL ? -1 : fill_from_outs(&f, out, parent, o);
        Py_XDECREF(o);
        if (rc < 0) goto fail;
        goto done;
    }
    for (i = 0; i < n; i++) count[i + 1] += count[i];  /* each switch's ports, by value */
    Py_ssize_t *next = count + n + 2;
    memcpy(next, count, sizeof(Py_ssize_t) * ((size_t)n + 1));
    for (Py_ssize_t r = 0; r < m; r++) {
        Py_ssize_t j = next[rec[r].owner]++, lo = count[rec[r].owner];
        while (j > lo && sorted[j - 1].v > rec[r].v) {  /* (insertion: a switch has a few ports) */
            sorted[j] = sorted[j - 1];
            j--;
        }
        sorted[j] = rec[r];
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t lo = count[i], k = count[i + 1] - lo;
        PyObject *t = PyTuple_New(k);
        if (t == NULL) goto fail;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_INCREF(sorted[lo + j].port);
            PyTuple_SET_ITEM(t, j, sorted[lo + j].port);
        }
        if (fill_one(&f, out, node[i], par[i], t) < 0) goto fail;
    }
done:
    fill_tree_free(&ids, node, par, held, rec, m, count);
    return out;
fail:
    fill_tree_free(&ids, node, par, held, rec, m, count);
    Py_DECREF(out);
    return NULL;
}

/* -- MulticastCore._guard_py and _want_ff_py: a protected link's shared entries ----------
 * A new core's first 1000 trees on fat-tree:16 bring ~3,900 protected link ends into use,
 * each wanting its detour's transit flows, its rejoin and both FF groups of its port:
 * ~20,000 _want calls, ~0.04 s of a ~0.5 s build in Python. The same steps, in the same
 * order (the keys noted dirty in the same order), reading the core's attributes each
 * call (nicira and the dicts may be replaced). parts: (protect.tag,
 * protect.rejoin_actions, ofmsgs.TABLE, OFPP_IN_PORT, FF_BASE, IN_PORT_BIT, MAX_PORT). */
static PyObject *str_guards, *str_detours, *str_get, *str_shared_want, *str_dirty_attr, *str_ff_refs,
    *str_nicira, *str_rejoin;  /* (str_view_attr, str_port_link, str_port_of: detour_miss's) */

typedef struct {
    PyObject *core, *tag, *rejoin_actions, *table, *in_port;
    unsigned long ff_base, in_port_bit, max_port;
    PyObject *guards, *shared_want, *dirty, *ff_refs;  /* (new references) */
} Guard;

static void guard_clear(Guard *g) {
    Py_CLEAR(g->guards);
    Py_CLEAR(g->shared_want);
    Py_CLEAR(g->dirty);
    Py_CLEAR(g->ff_refs);
}

static int guard_init(Guard *g, PyObject *core, PyObject *parts) {
    memset(g, 0, sizeof *g);
    if (!PyTuple_CheckExact(parts) || PyTuple_GET_SIZE(parts) != 7) {
        PyErr_SetString(PyExc_TypeError, "guard: parts must be a tuple of 7");
        return -1;
    }
    g->core = core;
    g->tag = PyTuple_GET_ITEM(parts, 0);
    g->rejoin_actions = PyTuple_GET_ITEM(parts, 1);
    g->table = PyTuple_GET_ITEM(parts, 2);
    g->in_port = PyTuple_GET_ITEM(parts, 3);
    g->ff_base = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(parts, 4));
    g->in_port_bit = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(parts, 5));
    g->max_port = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(parts, 6));
    if (PyErr_Occurred()) return -1;
    g->guards = PyObject_GetAttr(core, str_guards);
    g->shared_want = g->guards ? PyObject_GetAttr(core, str_shared_want) : NULL;
    g->dirty = g->shared_want ? PyObject_GetAttr(core, str_dirty_attr) : NULL;
    g->ff_refs = g->dirty ? PyObject_GetAttr(core, str_ff_refs) : NULL;
    if (!g->ff_refs) {
        guard_clear(g);
        return -1;
    }
    if (!PyDict_Check(g->guards) || !PyDict_Check(g->ff_refs)) {
        PyErr_SetString(PyExc_TypeError, "guard: the core's guards and ff_refs must be dicts");
        guard_clear(g);
        return -1;
    }
    return 0;
}

/* MulticastCore._want: spec NULL drops the entry; a change notes the key dirty. Steals
 * nothing. */
static int want_entry(Guard *g, PyObject *dpid, PyObject *key, PyObject *spec) {
    PyObject *want = PyObject_GetItem(g->shared_want, dpid);  /* (a defaultdict: made if missing) */
    if (!want) return -1;
    if (!PyDict_Check(want)) {
        PyErr_SetString(PyExc_TypeError, "guard: a switch's wanted entries must be a dict");
        Py_DECREF(want);
        return -1;
    }
    PyObject *cur = PyDict_GetItemWithError(want, key);
    if (!cur && PyErr_Occurred()) {
        Py_DECREF(want);
        return -1;
    }
    int rc = 0;
    if (spec == NULL) {
        if (!cur) {
            Py_DECREF(want);
            return 0;
        }
        rc = PyDict_DelItem(want, key);
    } else {
        if (cur) {
            int eq = PyObject_RichCompareBool(cur, spec, Py_EQ);
            if (eq != 0) {
                Py_DECREF(want);
                return eq < 0 ? -1 : 0;
            }
        }
        rc = PyDict_SetItem(want, key, spec);
    }
    Py_DECREF(want);
    if (rc < 0) return -1;
    PyObject *keys = PyObject_GetItem(g->dirty, dpid);
    if (!keys) return -1;
    rc = PySet_Check(keys) ? PySet_Add(keys, key) : (PyErr_SetString(PyExc_TypeError,
                                                                    "guard: dirty keys must be a set"), -1);
    Py_DECREF(keys);
    return rc;
}

/* MulticastCore._want_ff_py. */
static int want_ff_entry(Guard *g, PyObject *dpid, unsigned long ffid) {
    PyObject *ff = PyLong_FromUnsignedLong(ffid);
    PyObject *port = ff ? PyLong_FromUnsignedLong(ffid & g->max_port) : NULL;
    PyObject *link = port ? PyTuple_Pack(2, dpid, port) : NULL;
    PyObject *key = link ? PyTuple_Pack(2, str_ff, ff) : NULL;
    PyObject *spec = NULL;
    int rc = -1;
    if (!key) goto done;
    PyObject *d = PyDict_GetItemWithError(g->guards, link);  /* (borrowed) */
    if (!d && PyErr_Occurred()) goto done;
    if (d && d != Py_None) {
        PyObject *refs = PyDict_GetItemWithError(g->ff_refs, dpid);  /* (.get: no new entry) */
        if (!refs && PyErr_Occurred()) goto done;
        int used = refs ? PySequence_Contains(refs, ff) : 0;
        if (used < 0) goto done;
        if (used) {
            if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) < 1) {
                PyErr_SetString(PyExc_TypeError, "guard: a detour must be a Detour");
                goto done;
            }
            PyObject *first = PyTuple_GET_ITEM(d, 0);
            Py_INCREF(first);  /* (held across the call into Python: the guard may change meanwhile) */
            PyObject *link_tag = PyObject_CallFunctionObjArgs(g->tag, dpid, port, NULL);
            if (link_tag)
                spec = Py_BuildValue("((O((OO)))(O((OOO)(OO))))", port, str_output, port, first, str_set_field,
                                     str_eth_dst, link_tag, str_output, (ffid & g->in_port_bit) ? g->in_port : first);
            Py_XDECREF(link_tag);
            Py_DECREF(first);
            if (!spec) goto done;
        }
    }
    rc = want_entry(g, dpid, key, spec);
done:
    Py_XDECREF(spec);
    Py_XDECREF(key);
    Py_XDECREF(link);
    Py_XDECREF(port);
    Py_XDECREF(ff);
    return rc;
}

/* The (dpid, in_port, out_port) hops of detour d (a protect.Detour: first, transit,
 * rejoin, arrival), after checking its shape. */
static PyObject *detour_transit(PyObject *d) {
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(d, 1))) {
        PyErr_SetString(PyExc_TypeError, "guard: a detour must be a Detour");
        return NULL;
    }
    PyObject *transit = PyTuple_GET_ITEM(d, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(transit); i++) {
        PyObject *hop = PyTuple_GET_ITEM(transit, i);
        if (!PyTuple_Check(hop) || PyTuple_GET_SIZE(hop) != 3) {
            PyErr_SetString(PyExc_TypeError, "guard: a detour's hop must be (dpid, in_port, out_port)");
            return NULL;
        }
    }
    return transit;
}

static int core_nicira(Guard *g) {
    PyObject *v = PyObject_GetAttr(g->core, str_nicira);
    if (!v) return -1;
    int on = PyObject_IsTrue(v);
    Py_DECREF(v);
    return on;
}

/* Detour d's transit flows wanted (arm) or dropped, and with Nicira actions its rejoin. */
static int detour_entries(Guard *g, PyObject *key, PyObject *d, PyObject *link_tag, int arm) {
    PyObject *transit = detour_transit(d);
    if (!transit) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(transit); i++) {
        PyObject *hop = PyTuple_GET_ITEM(transit, i);
        PyObject *k = PyTuple_Pack(3, str_transit, PyTuple_GET_ITEM(hop, 1), link_tag);
        PyObject *spec = k && arm ? Py_BuildValue("((OO))", str_output, PyTuple_GET_ITEM(hop, 2)) : NULL;
        int rc = k && (spec || !arm) ? want_entry(g, PyTuple_GET_ITEM(hop, 0), k, spec) : -1;
        Py_XDECREF(spec);
        Py_XDECREF(k);
        if (rc < 0) return -1;
    }
    int nicira = core_nicira(g);
    if (nicira <= 0) return nicira;
    PyObject *rejoin = PyTuple_GET_ITEM(d, 2), *acts = NULL, *k;
    if (arm) {  /* (the far end's port of the link: where the copy is looked up again) */
        PyObject *view = PyObject_GetAttr(g->core, str_view_attr);
        PyObject *port_link = view ? PyObject_GetAttr(view, str_port_link) : NULL;
        PyObject *link = port_link ? PyObject_GetItem(port_link, key) : NULL;
        PyObject *far = link ? PyObject_CallMethodObjArgs(link, str_port_of, rejoin, NULL) : NULL;
        acts = far ? PyObject_CallFunctionObjArgs(g->rejoin_actions, far, g->table, NULL) : NULL;
        Py_XDECREF(far);
        Py_XDECREF(link);
        Py_XDECREF(port_link);
        Py_XDECREF(view);
        if (!acts) return -1;
    }
    k = PyTuple_Pack(3, str_rejoin, PyTuple_GET_ITEM(d, 3), link_tag);
    int rc = k ? want_entry(g, rejoin, k, acts) : -1;
    Py_XDECREF(k);
    Py_XDECREF(acts);
    return rc;
}

/* MulticastCore._guard_py: link key came into use (on), went out of use, or (on again)
 * its detour changed. */
static int guard_step(Guard *g, PyObject *key, int on) {
    if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) {
        PyErr_SetString(PyExc_TypeError, "guard: a protected link is a (dpid, port) tuple");
        return -1;
    }
    PyObject *dpid = PyTuple_GET_ITEM(key, 0), *port = PyTuple_GET_ITEM(key, 1);
    unsigned long p = PyLong_AsUnsignedLong(port);
    if (p == (unsigned long)-1 && PyErr_Occurred()) return -1;
    PyObject *link_tag = PyObject_CallFunctionObjArgs(g->tag, dpid, port, NULL);
    if (!link_tag) return -1;
    int rc = -1;
    PyObject *d = PyDict_GetItemWithError(g->guards, key);
    if (!d && PyErr_Occurred()) goto done;
    if (d) {  /* (popped: the entries of the detour it had are dropped) */
        Py_INCREF(d);
        int r = PyDict_DelItem(g->guards, key);
        if (r == 0 && d != Py_None) r = detour_entries(g, key, d, link_tag, 0);
        Py_DECREF(d);
        if (r < 0) goto done;
    }
    if (on) {
        PyObject *detours = PyObject_GetAttr(g->core, str_detours);
        PyObject *fresh = detours ? PyObject_CallMethodObjArgs(detours, str_get, dpid, port, NULL) : NULL;
        Py_XDECREF(detours);
        if (!fresh) goto done;
        int r = PyDict_SetItem(g->guards, key, fresh);
        if (r == 0 && fresh != Py_None) r = detour_entries(g, key, fresh, link_tag, 1);
        Py_DECREF(fresh);
        if (r < 0) goto done;
    }
    if (want_ff_entry(g, dpid, g->ff_base | p) < 0 ||
        want_ff_entry(g, dpid, g->ff_base | g->in_port_bit | p) < 0)
        goto done;
    rc = 0;
done:
    Py_DECREF(link_tag);
    return rc;
}

static PyObject *guard(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "guard(core, key, on, parts)");
        return NULL;
    }
    int on = PyObject_IsTrue(args[2]);
    Guard g;
    if (on < 0 || guard_init(&g, args[0], args[3]) < 0) return NULL;
    int rc = guard_step(&g, args[1], on);
    guard_clear(&g);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *want_ff(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "want_ff(core, dpid, ffid, parts)");
        return NULL;
    }
    unsigned long ffid = PyLong_AsUnsignedLong(args[2]);
    Guard g;
    if ((ffid == (unsigned long)-1 && PyErr_Occurred()) || guard_init(&g, args[0], args[3]) < 0) return NULL;
    int rc = want_ff_entry(&g, args[1], ffid);
    guard_clear(&g);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, "MulticastCore._fill's loop (see there)"},
    {"tree_adds", (PyCFunction)(void (*)(void))tree_adds, METH_FASTCALL, "ofmsgs.tree_adds's loop (see there)"},
    {"spt_grid", (PyCFunction)(void (*)(void))spt_grid, METH_FASTCALL, "trees._spt_vector's search on the grid (see there)"},
    {"outs", (PyCFunction)(void (*)(void))outs, METH_FASTCALL, "trees._fill_entries's loop (see there)"},
    {"fill_tree", (PyCFunction)(void (*)(void))fill_tree, METH_FASTCALL, "outs and fill in one call (see there)"},
    {"bump", (PyCFunction)(void (*)(void))bump, METH_FASTCALL, "trees.LinkLoad.add_links's loop (see there)"},
    {"crossing", (PyCFunction)(void (*)(void))crossing, METH_FASTCALL, "trees._crossing_py's scan (see there)"},
    {"changed_of", (PyCFunction)(void (*)(void))changed_of, METH_FASTCALL, "MulticastCore._changed_py (see there)"},
    {"diff_switches", (PyCFunction)(void (*)(void))diff_switches, METH_FASTCALL,
     "MulticastCore._diff_switches_py's loop (see there)"},
    {"regraft", (PyCFunction)(void (*)(void))regraft, METH_FASTCALL, "trees.regraft_py's steps (see there)"},
    {"reprotect", (PyCFunction)(void (*)(void))reprotect, METH_FASTCALL, "MulticastCore._reprotect_py's loop (see there)"},
    {"protect", (PyCFunction)(void (*)(void))protect, METH_FASTCALL, "MulticastCore._protect_py's loop (see there)"},
    {"recount", (PyCFunction)(void (*)(void))recount, METH_FASTCALL, "MulticastCore._recount_py's loop (see there)"},
    {"count", (PyCFunction)(void (*)(void))count, METH_FASTCALL, "MulticastCore._count_py's loop (see there)"},
    {"group_mod", (PyCFunction)(void (*)(void))group_mod, METH_FASTCALL, "ofmsgs._group_mod_py's bytes (see there)"},
    {"bfs_dag", (PyCFunction)(void (*)(void))bfs_dag, METH_FASTCALL, "trees.PathCache.dag's search (see there)"},
    {"path_around", (PyCFunction)(void (*)(void))path_around, METH_FASTCALL, "protect._path_around (see there)"},
    {"diff_shared", (PyCFunction)(void (*)(void))diff_shared, METH_FASTCALL,
     "MulticastCore._diff_shared_py's loop (see there)"},
    {"live_of", (PyCFunction)(void (*)(void))live_of, METH_FASTCALL, "MulticastCore._place_py's filter (see there)"},
    {"guard", (PyCFunction)(void (*)(void))guard, METH_FASTCALL, "MulticastCore._guard_py (see there)"},
    {"detour_miss", (PyCFunction)(void (*)(void))detour_miss, METH_FASTCALL, "protect.Detours._miss_py (see there)"},
    {"want_ff", (PyCFunction)(void (*)(void))want_ff, METH_FASTCALL, "MulticastCore._want_ff_py (see there)"},
    {"note_placed", (PyCFunction)(void (*)(void))note_placed, METH_FASTCALL,
     "MulticastCore._place_py's bookkeeping (see there)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "controller._fastplan",
    "A new tree's switch entries and messages in C (see controller.fastplan).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastplan(void) {
    str_group = PyUnicode_InternFromString("group");
    str_output = PyUnicode_InternFromString("output");
    str_dpid = PyUnicode_InternFromString("_dpid");
    str_wire = PyUnicode_InternFromString("_wire");
    str_xid = PyUnicode_InternFromString("xid");
    str_transit = PyUnicode_InternFromString("transit");
    str_ff = PyUnicode_InternFromString("ff");
    str_set_field = PyUnicode_InternFromString("set_field");
    str_eth_dst = PyUnicode_InternFromString("eth_dst");
    str_guards = PyUnicode_InternFromString("guards");
    str_detours = PyUnicode_InternFromString("detours");
    str_get = PyUnicode_InternFromString("get");
    str_shared_want = PyUnicode_InternFromString("shared_want");
    str_dirty_attr = PyUnicode_InternFromString("_dirty");
    str_ff_refs = PyUnicode_InternFromString("ff_refs");
    str_nicira = PyUnicode_InternFromString("nicira");
    str_port_link = PyUnicode_InternFromString("port_link");
    str_port_of = PyUnicode_InternFromString("port_of");
    str_rejoin = PyUnicode_InternFromString("rejoin");
    str_view_attr = PyUnicode_InternFromString("view");
    str_paths = PyUnicode_InternFromString("_paths");
    str_none = PyUnicode_InternFromString("_none");
    str_by_edge = PyUnicode_InternFromString("_by_edge");
    str_around = PyUnicode_InternFromString("_around");
    str_pair = PyUnicode_InternFromString("_pair");
    str_hint = PyUnicode_InternFromString("_hint");
    str_far_end = PyUnicode_InternFromString("far_end");
    str_nbr_ports = PyUnicode_InternFromString("nbr_ports");
    empty = PyTuple_New(0);
    if (!str_group || !str_output || !str_dpid || !str_wire || !str_xid || !str_transit || !str_ff ||
        !str_set_field || !str_eth_dst || !str_guards || !str_detours || !str_get || !str_shared_want ||
        !str_dirty_attr || !str_ff_refs || !str_nicira || !str_port_link || !str_port_of ||
        !str_rejoin || !str_view_attr || !str_paths || !str_none || !str_by_edge || !str_around || !str_pair ||
        !str_hint || !str_far_end || !str_nbr_ports || !empty)
        return NULL;
    return PyModule_Create(&moduledef);
}
