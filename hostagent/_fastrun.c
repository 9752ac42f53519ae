/* The receiver's clean-stream path in C: what hostagent/fastrun.py does in Python.
 *
 * A GRO super-packet (or a coalesced run) of DATA datagrams is checked header by header
 * and tag by tag exactly as hostagent.wire.parse_data_run checks it, and its payloads
 * are then moved together at the front of the buffer, so the receiver writes and hashes
 * one contiguous piece. Per datagram this saves the Python of a header unpack, a
 * comparison chain, a nonce, an AES-GCM object call (cryptography makes a fresh OpenSSL
 * context per call; here one context per session is reused) and a memoryview.
 *
 * The tests hold both implementations to the same verdicts and bytes
 * (tests/test_hostagent_fastrun.py); hostagent.fastrun falls back to the Python one,
 * with a warning, when this module was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>

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
    EVP_CIPHER_CTX *ctx;
} GmacObject;

static void Gmac_dealloc(GmacObject *self) {
    if (self->ctx) EVP_CIPHER_CTX_free(self->ctx);
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
static int gmac_tag(EVP_CIPHER_CTX *ctx, uint64_t seq, const unsigned char *aad, int len, unsigned char *tag) {
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
    int ok = data.len <= INT_MAX && gmac_tag(self->ctx, seq, data.buf, (int)data.len, tag);
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
    .tp_doc = "AES-256-GMAC under one session's key, with one reused OpenSSL context",
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
    EVP_CIPHER_CTX *ctx = NULL;
    if (gmac_obj != Py_None) {
        if (!PyObject_TypeCheck(gmac_obj, &GmacType)) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "gmac must be a Gmac or None");
            return NULL;
        }
        ctx = ((GmacObject *)gmac_obj)->ctx;
        if (ctx == NULL) {
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

static PyMethodDef module_methods[] = {
    {"verify_run", verify_run, METH_VARARGS,
     "verify_run(data, seg, gmac, prefix=False) -> (session, first, chunk, offset, count, first_len, last_len) or None"},
    {"compact_run", compact_run, METH_VARARGS, "compact_run(buffer, seg, tail) -> bytes of payload at the front"},
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
