/* A new tree's search, switch entries and messages in C: the layered least-loaded search
 * (trees._spt_vector) and the two per-switch loops of a group's first tree,
 * MulticastCore._fill (controller/core.py) and ofmsgs.tree_adds.
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

#define IN_PORT_BIT (1L << 15)
#define MAX_PORT (IN_PORT_BIT - 1)
#define FF_BASE 0xFFFF0000L

static PyObject *str_group, *str_output, *str_dpid, *str_wire, *empty;

/* A tuple subclass (SwitchEntry) of four items, as tuple.__new__(cls, (a, b, c, d)) makes it. */
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
    return e;
}

static int get_long(PyObject *o, long *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
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

static int count_ff(PyObject *refs, PyObject *f, PyObject *n, PyObject *want_ff, PyObject *guard) {
    long fv;
    if (get_long(f, &fv) < 0) return -1;
    PyObject *old = PyDict_GetItemWithError(refs, f);
    if (old == NULL && PyErr_Occurred()) return -1;
    long c = 1;
    if (old != NULL) {
        if (get_long(old, &c) < 0) return -1;
        c += 1;
    }
    PyObject *cv = PyLong_FromLong(c);
    if (cv == NULL || PyDict_SetItem(refs, f, cv) < 0) {
        Py_XDECREF(cv);
        return -1;
    }
    Py_DECREF(cv);
    if (c != 1) return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(want_ff, n, f, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    PyObject *sib = PyLong_FromLong(fv ^ IN_PORT_BIT);
    if (sib == NULL) return -1;
    int has = PyDict_Contains(refs, sib);
    Py_DECREF(sib);
    if (has < 0) return -1;
    if (has) return 0;
    PyObject *port = PyLong_FromLong(fv & MAX_PORT);
    if (port == NULL) return -1;
    PyObject *key = PyTuple_Pack(2, n, port);
    Py_DECREF(port);
    if (key == NULL) return -1;
    r = PyObject_CallFunctionObjArgs(guard, key, Py_True, NULL);
    Py_DECREF(key);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* One switch of a protected entry: (ff, rejoin) as MulticastCore._protection makes them,
 * the FF users counted as _fill counts them. Returns the entry (new reference). */
static PyObject *protected_entry(PyObject *n, PyObject *in_port, PyObject *out_ports, PyObject *up,
                                 PyObject *pieces, PyObject *piece, PyObject *ff_refs, PyObject *want_ff,
                                 PyObject *guard, PyObject *to_group, PyTypeObject *entry_type,
                                 PyObject *in_port_out) {
    Py_ssize_t k = PyTuple_GET_SIZE(out_ports), nff = 0;
    PyObject *result = NULL, *ff = NULL, *rejoin = NULL, *refs = NULL, *at = NULL;
    PyObject *stack[16];
    PyObject **pcs = k <= 16 ? stack : PyMem_Malloc(sizeof(PyObject *) * (size_t)k);
    Py_ssize_t got = 0;  /* pcs holding a reference */
    long in_c, arr_c = 0;
    int err = 0;
    if (pcs == NULL) return PyErr_NoMemory();
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
        if (PyTuple_GET_SIZE(up) < 5 || !PyTuple_Check(to_group) || PyTuple_GET_SIZE(to_group) < 1) {
            PyErr_SetString(PyExc_TypeError, "an uplink piece is a 5-tuple and to_group a tuple");
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
        if (hit < 0) {
            rejoin = PyTuple_Pack(3, arr, link_tag, to_group);
        } else {  /* the detour arrives over one of the outputs: each output listed */
            PyObject *acts = PyTuple_New(k + 1);
            if (acts == NULL) goto done;
            PyObject *first = PyTuple_GET_ITEM(to_group, 0);
            Py_INCREF(first);
            PyTuple_SET_ITEM(acts, 0, first);
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
                PyTuple_SET_ITEM(acts, i + 1, a);
            }
            rejoin = PyTuple_Pack(3, arr, link_tag, acts);
            Py_DECREF(acts);
        }
        if (rejoin == NULL) goto done;
    }
    result = make_entry(entry_type, in_port, out_ports, ff, rejoin);
    if (result == NULL) goto done;
    /* the FF groups' users (``_fill``'s count: a rejoin listing outputs may use some) */
    if (nff || (PyTuple_GET_SIZE(rejoin) && PyTuple_GET_SIZE(PyTuple_GET_ITEM(rejoin, 2)) > 2)) {
        refs = PyObject_GetItem(ff_refs, n);
        if (refs == NULL || !PyDict_Check(refs)) {
            if (refs != NULL) PyErr_SetString(PyExc_TypeError, "ff_refs[n] is a dict");
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nff; i++)
            if (count_ff(refs, PyTuple_GET_ITEM(ff, i), n, want_ff, guard) < 0) goto fail;
        if (PyTuple_GET_SIZE(rejoin)) {
            PyObject *acts = PyTuple_GET_ITEM(rejoin, 2);
            if (PyTuple_GET_SIZE(acts) > 2) {
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(acts); i++) {
                    PyObject *a = PyTuple_GET_ITEM(acts, i);
                    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) < 2) continue;
                    int is_group = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 0), str_group, Py_EQ);
                    if (is_group < 0) goto fail;
                    if (!is_group || !PyLong_Check(PyTuple_GET_ITEM(a, 1))) continue;
                    long f;
                    if (get_long(PyTuple_GET_ITEM(a, 1), &f) < 0) goto fail;
                    if (f >= FF_BASE && f < FF_BASE + 2 * IN_PORT_BIT &&
                        count_ff(refs, PyTuple_GET_ITEM(a, 1), n, want_ff, guard) < 0)
                        goto fail;
                }
            }
        }
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (Py_ssize_t i = 0; i < got; i++) Py_DECREF(pcs[i]);
    if (pcs != stack) PyMem_Free(pcs);
    Py_XDECREF(ff);
    Py_XDECREF(rejoin);
    Py_XDECREF(refs);
    Py_XDECREF(at);
    return result;
}

/* fill(entries, parent, outs, source_port, gid, switch_users, uplinks, uplink, protect,
 *      pieces, piece, ff_refs, want_ff, guard, to_group, entry_type, in_port_out)
 * MulticastCore._fill's loop: see there. */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "fill takes 17 arguments");
        return NULL;
    }
    PyObject *entries = args[0], *parent = args[1], *outs = args[2], *source_port = args[3], *gid = args[4],
             *switch_users = args[5], *uplinks = args[6], *uplink = args[7], *pieces = args[9],
             *piece = args[10], *ff_refs = args[11], *want_ff = args[12], *guard = args[13],
             *to_group = args[14], *in_port_out = args[16];
    int protect = PyObject_IsTrue(args[8]);
    if (protect < 0) return NULL;
    if (!PyDict_Check(entries) || !PyDict_Check(parent) || !PyDict_Check(outs) || !PyDict_Check(uplinks) ||
        !PyDict_Check(pieces) || !PyType_Check(args[15]) ||
        !PyType_IsSubtype((PyTypeObject *)args[15], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "fill: entries, parent, outs, uplinks and pieces are dicts, "
                                         "entry_type a tuple type");
        return NULL;
    }
    PyTypeObject *entry_type = (PyTypeObject *)args[15];
    Py_ssize_t pos = 0;
    PyObject *n, *ports;
    while (PyDict_Next(outs, &pos, &n, &ports)) {
        PyObject *par = PyDict_GetItemWithError(parent, n);
        if (par == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, n);
            return NULL;
        }
        if (!PyList_Check(ports) || PyList_Sort(ports) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "fill: outs holds lists");
            return NULL;
        }
        PyObject *out_ports = PyList_AsTuple(ports);
        if (out_ports == NULL) return NULL;
        PyObject *users = PyObject_GetItem(switch_users, n);
        if (users == NULL || PySet_Add(users, gid) < 0) {
            Py_XDECREF(users);
            Py_DECREF(out_ports);
            return NULL;
        }
        Py_DECREF(users);
        PyObject *in_port, *up, *u = NULL;
        if (par == Py_None) {
            in_port = source_port;
            up = empty;
        } else {
            PyObject *at = PyDict_GetItemWithError(uplinks, n);
            if (at != NULL) {
                u = PyDict_Check(at) ? PyDict_GetItemWithError(at, par) : NULL;
                Py_XINCREF(u);
            }
            if (u == NULL) {
                if (PyErr_Occurred() ||
                    (u = PyObject_CallFunctionObjArgs(uplink, n, par, NULL)) == NULL) {
                    Py_DECREF(out_ports);
                    return NULL;
                }
            }
            if (!PyTuple_Check(u) || PyTuple_GET_SIZE(u) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(u, 2))) {
                PyErr_SetString(PyExc_TypeError, "an uplink is (in_port, users, piece)");
                Py_DECREF(u);
                Py_DECREF(out_ports);
                return NULL;
            }
            in_port = PyTuple_GET_ITEM(u, 0);
            up = PyTuple_GET_ITEM(u, 2);
            if (PySet_Add(PyTuple_GET_ITEM(u, 1), gid) < 0) {
                Py_DECREF(u);
                Py_DECREF(out_ports);
                return NULL;
            }
        }
        PyObject *entry = protect ? protected_entry(n, in_port, out_ports, up, pieces, piece, ff_refs, want_ff,
                                                    guard, to_group, entry_type, in_port_out)
                                  : make_entry(entry_type, in_port, out_ports, empty, empty);
        Py_XDECREF(u);  /* (the uplinks dict keeps in_port and up alive) */
        Py_DECREF(out_ports);
        if (entry == NULL) return NULL;
        int rc = PyDict_SetItem(entries, n, entry);
        Py_DECREF(entry);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
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

/* A message object as ofmsgs._new(cls) with _dpid and _wire set, appended as (dpid, msg). */
static int add_msg(PyObject *out, PyObject *object_new, PyObject *cls, PyObject *dpid, PyObject *wire) {
    if (wire == NULL) return -1;
    PyObject *m = PyObject_CallOneArg(object_new, cls);
    if (m == NULL || PyObject_SetAttr(m, str_dpid, dpid) < 0 || PyObject_SetAttr(m, str_wire, wire) < 0) {
        Py_XDECREF(m);
        Py_DECREF(wire);
        return -1;
    }
    Py_DECREF(wire);
    PyObject *pair = PyTuple_Pack(2, dpid, m);
    Py_DECREF(m);
    if (pair == NULL) return -1;
    int rc = PyList_Append(out, pair);
    Py_DECREF(pair);
    return rc;
}

static int pair_of_bytes(PyObject *t) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(t, 1))) {
        PyErr_SetString(PyExc_TypeError, "expected (bytes, bytes)");
        return 0;
    }
    return 1;
}

/* tree_adds(gid, sg_head, sg_tail, dpids, entries, out, add_parts, make_parts, tags, make_tag,
 *           rejoin_flow, group_cls, flow_cls, object_new)
 * ofmsgs.tree_adds's loop: see there. ``rejoin_flow(acts)`` gives a rejoin flow's bytes
 * around its in_port and tag. */
static PyObject *tree_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "tree_adds takes 14 arguments");
        return NULL;
    }
    PyObject *sg_head = args[1], *sg_tail = args[2], *dpids = args[3], *entries = args[4], *out = args[5],
             *add_parts = args[6], *make_parts = args[7], *tags = args[8], *make_tag = args[9],
             *rejoin_flow = args[10], *group_cls = args[11], *flow_cls = args[12], *object_new = args[13];
    char gid_bytes[4], port[4];
    if (be32_of(args[0], gid_bytes) < 0) return NULL;
    if (!PyBytes_Check(sg_head) || !PyBytes_Check(sg_tail) || !PyDict_Check(entries) || !PyList_Check(out) ||
        !PyDict_Check(add_parts) || !PyDict_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tree_adds: bad argument types");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(dpids, "tree_adds: dpids is a sequence");
    if (seq == NULL) return NULL;
    PyObject *last = NULL, *rj = NULL, *e = NULL;  /* the last rejoin's actions and their flow's bytes */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
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
        PyObject *key = PyTuple_GetSlice(e, 0, 3);
        if (key == NULL) goto fail;
        PyObject *parts = PyDict_GetItemWithError(add_parts, key);
        if (parts != NULL) {
            Py_INCREF(parts);
        } else if (!PyErr_Occurred()) {
            parts = PyObject_CallOneArg(make_parts, key);
        }
        Py_DECREF(key);
        if (parts == NULL) goto fail;
        if (!pair_of_bytes(parts)) {
            Py_DECREF(parts);
            goto fail;
        }
        PyObject *wire = join4(PyTuple_GET_ITEM(parts, 0), gid_bytes, 4, PyTuple_GET_ITEM(parts, 1), NULL);
        Py_DECREF(parts);
        if (add_msg(out, object_new, group_cls, dpid, wire) < 0) goto fail;
        if (be32_of(PyTuple_GET_ITEM(e, 0), port) < 0) goto fail;
        if (add_msg(out, object_new, flow_cls, dpid, join4(sg_head, port, 4, sg_tail, NULL)) < 0) goto fail;
        PyObject *rejoin = PyTuple_GET_ITEM(e, 3);
        if (!PyTuple_Check(rejoin) || PyTuple_GET_SIZE(rejoin) == 0) continue;
        if (PyTuple_GET_SIZE(rejoin) != 3) {
            PyErr_SetString(PyExc_TypeError, "a rejoin is (arrival, tag, actions)");
            goto fail;
        }
        PyObject *acts = PyTuple_GET_ITEM(rejoin, 2);
        if (acts != last) {  /* (a group's rejoins mostly share one action list) */
            Py_XDECREF(rj);
            rj = PyObject_CallOneArg(rejoin_flow, acts);
            if (rj == NULL) goto fail;
            if (!pair_of_bytes(rj)) goto fail;
            Py_INCREF(acts);
            Py_XSETREF(last, acts);
        }
        PyObject *link_tag = PyTuple_GET_ITEM(rejoin, 1);
        PyObject *tlv = PyDict_GetItemWithError(tags, link_tag);
        if (tlv != NULL) {
            Py_INCREF(tlv);
        } else if (!PyErr_Occurred()) {
            tlv = PyObject_CallOneArg(make_tag, link_tag);
        }
        if (tlv == NULL) goto fail;
        if (!PyBytes_Check(tlv) || be32_of(PyTuple_GET_ITEM(rejoin, 0), port) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a tag's TLV is bytes");
            Py_DECREF(tlv);
            goto fail;
        }
        wire = join4(PyTuple_GET_ITEM(rj, 0), port, 4, tlv, PyTuple_GET_ITEM(rj, 1));
        Py_DECREF(tlv);
        if (add_msg(out, object_new, flow_cls, dpid, wire) < 0) goto fail;
    }
    Py_XDECREF(rj);
    Py_XDECREF(last);
    Py_XDECREF(e);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(rj);
    Py_XDECREF(last);
    Py_XDECREF(e);
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
        PyErr_SetString(PyExc_TypeError, "spt_vector: expected arrays of 8-byte integers");
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

/* spt_vector(layers, load, size, root, targets, dpids) -> (parent, used links as bytes, deepest)
 * trees._spt_vector's arithmetic (see there) in one pass per layer instead of numpy calls
 * on arrays of a few dozen rows, each of which cost more than its work. ``layers``: the
 * cache's (nodes, preds, links, rows) per hop count; ``load`` the link loads by link
 * number; ``targets`` node numbers; ``dpids`` node number -> dpid. */
static PyObject *spt_vector(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "spt_vector takes 6 arguments");
        return NULL;
    }
    PyObject *layers = args[0], *targets = args[4], *dpids = args[5];
    Py_ssize_t size = PyLong_AsSsize_t(args[2]), root = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(layers) || !PyList_Check(dpids) || size < 1 || root < 0 || root >= size ||
        PyList_GET_SIZE(dpids) < size) {
        PyErr_SetString(PyExc_ValueError, "spt_vector: bad layers, size, root or dpids");
        return NULL;
    }
    Py_ssize_t nl = PyList_GET_SIZE(layers);
    Ints load = {0};
    Ints *views = PyMem_Calloc((size_t)(3 * nl + 1), sizeof(Ints));
    int64_t *cost = PyMem_Malloc(sizeof(int64_t) * (size_t)size);
    Py_ssize_t *choice = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
    int64_t *uplink = PyMem_Calloc((size_t)size, sizeof(int64_t));
    char *mark = PyMem_Calloc((size_t)size, 1);
    Py_ssize_t *order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)size);  /* marked, deepest first */
    Py_ssize_t *ends = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nl + 1));  /* per layer, deepest first */
    PyObject *result = NULL, *parent = NULL, *used = NULL, *deepest = NULL;
    Py_ssize_t count = 0;
    if (!views || !cost || !choice || !uplink || !mark || !order || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    if (ints_get(args[1], &load, 1) < 0) goto done;
    for (Py_ssize_t i = 0; i < size; i++) cost[i] = FAR;
    cost[root] = 0;
    for (Py_ssize_t l = 0; l < nl; l++) {
        PyObject *t = PyList_GET_ITEM(layers, l);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "spt_vector: a layer is (nodes, preds, links, rows)");
            goto done;
        }
        Ints *nodes = &views[3 * l], *preds = &views[3 * l + 1], *links = &views[3 * l + 2];
        if (ints_get(PyTuple_GET_ITEM(t, 0), nodes, 1) < 0 || ints_get(PyTuple_GET_ITEM(t, 1), preds, 2) < 0 ||
            ints_get(PyTuple_GET_ITEM(t, 2), links, 2) < 0)
            goto done;
        Py_ssize_t rows = nodes->view.shape[0], width = preds->view.shape[1];
        if (preds->view.shape[0] != rows || links->view.shape[0] != rows || links->view.shape[1] != width ||
            width < 1) {
            PyErr_SetString(PyExc_ValueError, "spt_vector: a layer's arrays disagree");
            goto done;
        }
        for (Py_ssize_t r = 0; r < rows; r++) {
            int64_t node = at1(nodes, r), best = -1, bc = 0, bp = 0, bl = 0;
            if (node < 0 || node >= size) goto range;
            for (Py_ssize_t j = 0; j < width; j++) {
                int64_t p = at2(preds, r, j), k = at2(links, r, j);
                if (p < 0 || p >= size || k < 0 || k >= load.view.shape[0]) goto range;
                int64_t c = cost[p] + at1(&load, k);
                if (best < 0 || c < bc) {
                    best = j;
                    bc = c;
                    bp = p;
                    bl = k;
                }
            }
            cost[node] = bc;
            choice[node] = (Py_ssize_t)bp;
            uplink[node] = bl;
        }
    }
    PyObject *tseq = PySequence_Fast(targets, "spt_vector: targets is a sequence");
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
    /* from the deepest layer up: a switch is in the tree when marked; it marks its choice */
    Py_ssize_t used_layers = 0;
    for (Py_ssize_t l = nl - 1; l >= 0; l--) {
        Ints *nodes = &views[3 * l];
        Py_ssize_t before = count;
        for (Py_ssize_t r = 0; r < nodes->view.shape[0]; r++) {
            Py_ssize_t node = (Py_ssize_t)at1(nodes, r);
            if (mark[node]) order[count++] = node;
        }
        for (Py_ssize_t i = before; i < count; i++) mark[choice[order[i]]] = 1;
        if (count > before) ends[used_layers++] = count;
    }
    used = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int64_t) * count);
    deepest = PyList_New(count + 1);
    parent = PyDict_New();
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
    /* the root first, then a layer at a time from the top, each in its layer's order */
    for (Py_ssize_t k = used_layers - 1; k >= 0; k--) {  /* (ends[k]: where layer k ends in order) */
        for (Py_ssize_t i = k > 0 ? ends[k - 1] : 0; i < ends[k]; i++) {
            if (PyDict_SetItem(parent, PyList_GET_ITEM(dpids, order[i]), PyList_GET_ITEM(dpids, choice[order[i]])) < 0)
                goto done;
        }
    }
    result = PyTuple_Pack(3, parent, used, deepest);
    goto done;
range:
    PyErr_SetString(PyExc_IndexError, "spt_vector: a node or link number out of range");
done:
    for (Py_ssize_t l = 0; views && l < 3 * nl; l++) ints_release(&views[l]);
    ints_release(&load);
    PyMem_Free(views);
    PyMem_Free(cost);
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

static PyMethodDef module_methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, "MulticastCore._fill's loop (see there)"},
    {"tree_adds", (PyCFunction)(void (*)(void))tree_adds, METH_FASTCALL, "ofmsgs.tree_adds's loop (see there)"},
    {"spt_vector", (PyCFunction)(void (*)(void))spt_vector, METH_FASTCALL, "trees._spt_vector's arithmetic (see there)"},
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
    empty = PyTuple_New(0);
    if (!str_group || !str_output || !str_dpid || !str_wire || !empty) return NULL;
    return PyModule_Create(&moduledef);
}
