/* The receiver's clean-stream path in C: what hostagent/fastrun.py does in Python.
 *
 * A GRO super-packet (or a coalesced run) of DATA datagrams is checked header by header
 * and tag by tag exactly as hostagent.wire.parse_data_run checks it, and its payloads
 * are then moved together at the front of the buffer, so the receiver writes and hashes
 * one contiguous piece. Per datagram this saves the Python of a header unpack, a
 * comparison chain, a nonce, an AES-GCM object call (cryptography makes a fresh OpenSSL
 * context per call; here one context per session is reused) and a memoryview.
 *
 * A narrow kernel: bytes in, a verdict and moved bytes out, no calls back into Python.
 * The tags are OpenSSL's (EVP AES-256-GCM with the datagram as additional data); no
 * cryptography is written here.
 *
 * The tests hold both implementations to the same verdicts and bytes
 * (tests/hostagent/test_fastrun.py); hostagent.fastrun falls back to the Python one,
 * with a warning, when this module was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define HEADER_LEN 32 /* common header (14) + DATA fields (18) */
#define MAC_LEN 16
#define MAX_DATAGRAM 65507
#define MAX_CHUNK_SIZE (16u * 1024u * 1024u)
#define VERSION 2
#define T_DATA 2
#define FLAG_MAC 0x01

static inline uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}
static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }


/* ------------------------------------------------------------------ Gmac */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx; /* OpenSSL's AES-256-GCM under the session's key, reused per tag */
} GmacObject;

static void Gmac_dealloc(GmacObject *self) {
    if (self->ctx) EVP_CIPHER_CTX_free(self->ctx); /* (frees and cleanses the key schedule) */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Gmac_init(GmacObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key", NULL};
    Py_buffer key;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*", kwlist, &key)) return -1;
    if (key.len != 32) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "an AES-256-GMAC key is 32 bytes");
        return -1;
    }
    if (self->ctx == NULL) self->ctx = EVP_CIPHER_CTX_new();
    int ok = self->ctx != NULL && EVP_EncryptInit_ex(self->ctx, EVP_aes_256_gcm(), NULL, key.buf, NULL) == 1;
    PyBuffer_Release(&key);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-256-GCM");
        return -1;
    }
    return 0;
}

/* The tag of ``aad`` under nonce 4 zero bytes + ``seq`` (big-endian): wire._data_tag. */
static int gmac_tag(GmacObject *g, uint64_t seq, const unsigned char *aad, int len, unsigned char *tag) {
    EVP_CIPHER_CTX *ctx = g->ctx;
    unsigned char iv[12] = {0};
    unsigned char none[16];
    int outl;
    for (int i = 0; i < 8; i++) iv[4 + i] = (unsigned char)(seq >> (56 - 8 * i));
    return EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv) == 1 && EVP_EncryptUpdate(ctx, NULL, &outl, aad, len) == 1 &&
           EVP_EncryptFinal_ex(ctx, none, &outl) == 1 &&
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, MAC_LEN, tag) == 1;
}

static PyObject *Gmac_tag(GmacObject *self, PyObject *args) {
    unsigned long long seq;
    Py_buffer data;
    unsigned char tag[MAC_LEN];
    if (self->ctx == NULL) {
        PyErr_SetString(PyExc_ValueError, "Gmac was not initialised with a key");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Ky*", &seq, &data)) return NULL;
    int ok = data.len <= INT_MAX && gmac_tag(self, seq, data.buf, (int)data.len, tag);
    PyBuffer_Release(&data);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-256-GMAC failed");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)tag, MAC_LEN);
}

static PyMethodDef Gmac_methods[] = {
    {"tag", (PyCFunction)Gmac_tag, METH_VARARGS, "tag(seq, data): the 16-byte AES-256-GMAC tag of data"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GmacType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostagent._fastrun.Gmac",
    .tp_basicsize = sizeof(GmacObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Gmac(key): AES-256-GMAC under one session's key, through one reused OpenSSL AES-256-GCM context",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Gmac_init,
    .tp_dealloc = (destructor)Gmac_dealloc,
    .tp_methods = Gmac_methods,
};

/* ------------------------------------------------------------------ runs */

/* verify_run(data, seg, gmac, prefix=False) -> (session, first, chunk, offset, count, first_len, last_len) | None
 * With prefix, a run that breaks after its first datagram is taken up to the break (count
 * says how far); without, it is refused whole. */
static PyObject *verify_run(PyObject *module, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t seg;
    PyObject *gmac_obj;
    int prefix = 0;
    if (!PyArg_ParseTuple(args, "y*nO|p", &buf, &seg, &gmac_obj, &prefix)) return NULL;
    GmacObject *ctx = NULL;
    if (gmac_obj != Py_None) {
        if (!PyObject_TypeCheck(gmac_obj, &GmacType)) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "gmac must be a Gmac or None");
            return NULL;
        }
        ctx = (GmacObject *)gmac_obj;
        if (ctx->ctx == NULL) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_ValueError, "Gmac was not initialised with a key");
            return NULL;
        }
    }
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len;
    PyObject *result = Py_None;
    const int tail = ctx ? MAC_LEN : 0;
    const unsigned want = ctx ? FLAG_MAC : 0;
    const Py_ssize_t least = HEADER_LEN + tail;
    if (seg <= HEADER_LEN || seg >= n || seg > MAX_DATAGRAM) goto done;
    uint64_t session = be64(p + 6), first = be64(p + 14), seq = first;
    uint32_t chunk = be32(p + 22), start = be32(p + 26);
    uint64_t pos = start;
    Py_ssize_t count = 0, first_len = 0, last_len = 0;
    unsigned char tag[MAC_LEN];
    for (Py_ssize_t off = 0; off < n; off += seg) {
        Py_ssize_t end = off + seg < n ? off + seg : n;
        const unsigned char *d = p + off;
        if (end - off <= least) goto broken;
        Py_ssize_t plen = be16(d + 30);
        if (d[0] != 'M' || d[1] != 'C' || d[2] != VERSION || d[3] != T_DATA || d[4] != want ||
            be64(d + 6) != session || be64(d + 14) != seq || (count > 0 && seq == 0) ||
            be32(d + 22) != chunk || (uint64_t)be32(d + 26) != pos || plen != end - off - least ||
            pos + (uint64_t)plen > MAX_CHUNK_SIZE)
            goto broken;
        if (ctx) {
            end -= MAC_LEN;
            if (!gmac_tag(ctx, seq, d, (int)(end - off), tag) || CRYPTO_memcmp(tag, p + end, MAC_LEN) != 0) goto broken;
        }
        if (count == 0) first_len = plen;
        last_len = plen;
        count++;
        seq++; /* past 2^64 - 1 it wraps to 0, which the next datagram's check refuses */
        pos += (uint64_t)plen;
    }
    goto whole;
broken:
    if (!prefix || count == 0) goto done;
whole:
    result = Py_BuildValue("(KKIInnn)", (unsigned long long)session, (unsigned long long)first, chunk, start,
                           count, first_len, last_len);
    PyBuffer_Release(&buf);
    return result;
done:
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* compact_run(buffer, seg, tail) -> payload bytes: each datagram's payload moved to
 * follow the one before at the buffer's front (a run verify_run accepted). */
static PyObject *compact_run(PyObject *module, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t seg, tail;
    if (!PyArg_ParseTuple(args, "w*nn", &buf, &seg, &tail)) return NULL;
    if (seg <= HEADER_LEN + tail || tail < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "segment too short for a datagram");
        return NULL;
    }
    unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len, out = 0;
    for (Py_ssize_t off = 0; off < n; off += seg) {
        Py_ssize_t end = (off + seg < n ? off + seg : n) - tail;
        Py_ssize_t len = end - off - HEADER_LEN;
        if (len < 0) len = 0;
        memmove(p + out, p + off + HEADER_LEN, (size_t)len);
        out += len;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(out);
}


/* ------------------------------------------------------------------ reads */

#define SOL_UDP_ 17
#define UDP_GRO_ 104
#define MAX_READ 65535

/* read_runs(fd, buffer, limit, join, gro) -> (runs, reads, read_bytes, gro_batches, coalesced, drained)
 *
 * hostagent.net.DatagramReader.read's coalescing loop without the Python per read: up to
 * ``limit`` reads from the non-blocking socket ``fd`` into ``buffer`` back to back, joined
 * into runs exactly as the Python loop joins them (same source, every datagram the run's
 * size, a shorter one closes it, at most ``join`` bytes). ``runs``: (start, end, seg, addr)
 * per run, seg 0 for a single datagram; ``coalesced``: runs joined from more than one read. It stops when the socket is drained
 * (``drained``), after ``limit`` reads, or when the buffer has no room for one more read;
 * the caller hands the runs on before it calls again (the next call reuses the buffer). */
static PyObject *addr_object(const struct sockaddr_in *sa) {
    char host[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &sa->sin_addr, host, sizeof host) == NULL) return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(si)", host, (int)ntohs(sa->sin_port));
}

static int flush_run(PyObject *runs, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size, Py_ssize_t count,
                     Py_ssize_t joined, PyObject *src, Py_ssize_t *coalesced) {
    if (joined > 1) (*coalesced)++;
    PyObject *run = Py_BuildValue("(nnnO)", start, end, count > 1 ? size : (Py_ssize_t)0, src);
    if (run == NULL) return -1;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc;
}

static PyObject *read_runs(PyObject *module, PyObject *args) {
    int fd, gro;
    Py_buffer buf;
    Py_ssize_t limit, join;
    if (!PyArg_ParseTuple(args, "iw*nnp", &fd, &buf, &limit, &join, &gro)) return NULL;
    unsigned char *view = buf.buf;
    const Py_ssize_t len = buf.len;
    PyObject *runs = PyList_New(0), *src = NULL, *last = NULL, *result = NULL;
    struct sockaddr_in last_sa, sa;
    memset(&last_sa, 0, sizeof last_sa);
    Py_ssize_t reads = 0, read_bytes = 0, gro_batches = 0, coalesced = 0;
    Py_ssize_t start = 0, end = 0, size = 0, count = 0, joined = 0;
    int drained = 0;
    if (runs == NULL) goto out;
    while (reads < limit && end + MAX_READ <= len) {
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {view + end, (size_t)(len - end)};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_name = &sa;
        msg.msg_namelen = sizeof sa;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (gro) {
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
        }
        ssize_t nbytes = recvmsg(fd, &msg, MSG_DONTWAIT);
        if (nbytes < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0) goto out;
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                drained = 1;
                break;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            goto out;
        }
        if (msg.msg_namelen < sizeof sa || sa.sin_family != AF_INET) {
            PyErr_SetString(PyExc_ValueError, "read_runs reads IPv4 sockets only");
            goto out;
        }
        reads++;
        read_bytes += nbytes;
        Py_ssize_t seg = 0;
        for (struct cmsghdr *c = gro ? CMSG_FIRSTHDR(&msg) : NULL; c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_UDP_ && c->cmsg_type == UDP_GRO_ && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int v;
                memcpy(&v, CMSG_DATA(c), sizeof v);
                seg = v;
            }
        }
        if (seg <= 0 || seg >= nbytes) seg = 0;
        else gro_batches++;
        int same = last != NULL && sa.sin_addr.s_addr == last_sa.sin_addr.s_addr && sa.sin_port == last_sa.sin_port;
        if (!same) {
            PyObject *a = addr_object(&sa);
            if (a == NULL) goto out;
            Py_XDECREF(last);
            last = a;
            last_sa = sa;
        }
        if (nbytes == 0) { /* nothing to join: the run first, then the empty datagram alone */
            if (count && flush_run(runs, start, end, size, count, joined, src, &coalesced) < 0) goto out;
            start = end;
            count = 0;
            if (flush_run(runs, end, end, 0, 1, 1, last, &coalesced) < 0) goto out;
            continue;
        }
        /* this read: datagrams of width bytes, all of them that size (whole) or not */
        Py_ssize_t width = seg ? seg : nbytes;
        int whole = nbytes % width == 0;
        Py_ssize_t pieces = (nbytes + width - 1) / width;
        if (count && src == last && end + nbytes - start <= join && (seg ? width == size : nbytes <= size)) {
            end += nbytes;
            count += pieces;
            joined++;
            if (!whole || nbytes < size) { /* a shorter datagram ends the run, as in GRO */
                if (flush_run(runs, start, end, size, count, joined, src, &coalesced) < 0) goto out;
                start = end;
                count = 0;
            }
            continue;
        }
        if (count && flush_run(runs, start, end, size, count, joined, src, &coalesced) < 0) goto out;
        Py_XINCREF(last);
        Py_XDECREF(src);
        src = last;
        start = end;
        size = width;
        count = pieces;
        joined = 1;
        end += nbytes;
        if (!whole) {
            if (flush_run(runs, start, end, size, count, joined, src, &coalesced) < 0) goto out;
            start = end;
            count = 0;
        }
    }
    if (count && flush_run(runs, start, end, size, count, joined, src, &coalesced) < 0) goto out;
    result = Py_BuildValue("(OnnnnO)", runs, reads, read_bytes, gro_batches, coalesced, drained ? Py_True : Py_False);
out:
    Py_XDECREF(runs);
    Py_XDECREF(src);
    Py_XDECREF(last);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef module_methods[] = {
    {"verify_run", verify_run, METH_VARARGS,
     "verify_run(data, seg, gmac, prefix=False) -> (session, first, chunk, offset, count, first_len, last_len) or None"},
    {"compact_run", compact_run, METH_VARARGS, "compact_run(buffer, seg, tail) -> bytes of payload at the front"},
    {"read_runs", read_runs, METH_VARARGS,
     "read_runs(fd, buffer, limit, join, gro) -> (runs, reads, read_bytes, gro_batches, coalesced, drained)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "hostagent._fastrun", "The receiver's clean-stream path in C (see hostagent.fastrun).",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastrun(void) {
    if (PyType_Ready(&GmacType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&GmacType);
    if (PyModule_AddObject(m, "Gmac", (PyObject *)&GmacType) < 0) {
        Py_DECREF(&GmacType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
