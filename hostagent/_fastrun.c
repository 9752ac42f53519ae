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
#include <arpa/inet.h>
#include <errno.h>
#if defined(__x86_64__) && !defined(MODELCAST_NO_FAST_GMAC) && \
    ((defined(__clang__) && __clang_major__ >= 8) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9))
#define HAVE_FAST_GMAC 1
#include <immintrin.h>
#endif
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
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


/* ------------------------------------------------------------------ fast GMAC */

/* AES-256-GMAC without OpenSSL's per-call dispatch and with a 4-lane GHASH: on CPUs with
 * VPCLMULQDQ/AVX-512 and AES-NI (checked at run time; otherwise OpenSSL's EVP does it).
 * The tag is GHASH_H(data, lengths) xor AES_K(J0), J0 = nonce || 1, as in GCM with the data
 * as additional data and no ciphertext (what cryptography's AESGCM computes; the tests
 * hold all three to the same tags).
 *
 * GHASH works on byte-reflected blocks (x^0 at bit 127 of the 128-bit integer), where a
 * carry-less product of a and b is the reflected a*b*x; so the key powers are kept as
 * H^i * x^-1, and each product of a block and a power is the reflected a*H^i. The 256-bit
 * products are reduced modulo x^128 + x^7 + x^2 + x + 1 by two multiplications with
 * 0xc2 << 56, the reflected x^-1 (the Linux kernel's aes-gcm-avx10 does the same). */

#ifdef HAVE_FAST_GMAC
#define FAST_POWERS 16

typedef struct {
    __m128i rk[15];                 /* AES-256 round keys */
    __m128i h[FAST_POWERS];         /* h[i] = H^(i+1) * x^-1, reflected */
    __m512i hz[FAST_POWERS / 4];    /* per 64-byte step: the powers for its 4 blocks */
} FastKey;

#define FAST_TARGET __attribute__((target("sse4.1,aes,pclmul,avx2,avx512f,avx512bw,vpclmulqdq")))

/* each 32-bit word xor every word below it: the running xor of the AES key schedule */
FAST_TARGET static inline __m128i words_prefix_xor(__m128i x) {
    x = _mm_xor_si128(x, _mm_slli_si128(x, 4));
    return _mm_xor_si128(x, _mm_slli_si128(x, 8));
}

/* the next even round key from the one two back (t1) and the assist of the last (t2) */
FAST_TARGET static inline __m128i aes_assist1(__m128i t1, __m128i t2) {
    return _mm_xor_si128(words_prefix_xor(t1), _mm_shuffle_epi32(t2, 0xff));
}

/* the next odd round key (AES-256: SubWord without the rotation) */
FAST_TARGET static inline __m128i aes_assist2(__m128i t1, __m128i t3) {
    return _mm_xor_si128(words_prefix_xor(t3), _mm_shuffle_epi32(_mm_aeskeygenassist_si128(t1, 0x0), 0xaa));
}

#define AES_STEP(i, rcon)                                              \
    t1 = aes_assist1(t1, _mm_aeskeygenassist_si128(t3, rcon));         \
    k->rk[i] = t1;                                                     \
    if (i < 14) {                                                      \
        t3 = aes_assist2(t1, t3);                                      \
        k->rk[i + 1] = t3;                                             \
    }

FAST_TARGET static void aes256_expand(const unsigned char *key, FastKey *k) {
    __m128i t1 = _mm_loadu_si128((const __m128i *)key), t3 = _mm_loadu_si128((const __m128i *)(key + 16));
    k->rk[0] = t1;
    k->rk[1] = t3;
    AES_STEP(2, 0x01) AES_STEP(4, 0x02) AES_STEP(6, 0x04) AES_STEP(8, 0x08) AES_STEP(10, 0x10)
    AES_STEP(12, 0x20) AES_STEP(14, 0x40)
}

FAST_TARGET static inline __m128i aes256_block(const FastKey *k, __m128i b) {
    b = _mm_xor_si128(b, k->rk[0]);
    for (int i = 1; i < 14; i++) b = _mm_aesenc_si128(b, k->rk[i]);
    return _mm_aesenclast_si128(b, k->rk[14]);
}

FAST_TARGET static inline __m128i bswap128(__m128i x) {
    return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* (lo, mi, hi) of a product -> the reduced, reflected product */
FAST_TARGET static inline __m128i ghash_reduce(__m128i lo, __m128i mi, __m128i hi) {
    const __m128i poly = _mm_set_epi64x((long long)0xc200000000000000ULL, 1);
    __m128i t = _mm_clmulepi64_si128(poly, lo, 0x01);
    mi = _mm_xor_si128(mi, _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t));
    t = _mm_clmulepi64_si128(poly, mi, 0x01);
    return _mm_xor_si128(hi, _mm_xor_si128(_mm_shuffle_epi32(mi, 0x4e), t));
}

FAST_TARGET static inline __m128i ghash_mul(__m128i a, __m128i b) {
    __m128i lo = _mm_clmulepi64_si128(a, b, 0x00), hi = _mm_clmulepi64_si128(a, b, 0x11);
    __m128i mi = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
    return ghash_reduce(lo, mi, hi);
}

FAST_TARGET static void fast_init(FastKey *k, const unsigned char *key) {
    aes256_expand(key, k);
    __m128i h = bswap128(aes256_block(k, _mm_setzero_si128()));
    /* H * x^-1: the reflected integer shifted left by one, x^-1 folded in for the bit out */
    __m128i carry = _mm_srli_epi64(h, 63);                       /* each qword's top bit */
    __m128i shifted = _mm_or_si128(_mm_slli_epi64(h, 1), _mm_slli_si128(carry, 8));
    __m128i top = _mm_shuffle_epi32(carry, 0xee);                /* the high qword's top bit, both halves */
    __m128i mask = _mm_sub_epi64(_mm_setzero_si128(), top);      /* all ones if it was set */
    k->h[0] = _mm_xor_si128(shifted, _mm_and_si128(mask, _mm_set_epi64x((long long)0xc200000000000000ULL, 1)));
    for (int i = 1; i < FAST_POWERS; i++) k->h[i] = ghash_mul(k->h[i - 1], k->h[0]);
    for (int j = 0; j < FAST_POWERS / 4; j++) { /* lane 0 takes the highest power of its step */
        int top_power = FAST_POWERS - 4 * j - 1;
        k->hz[j] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(
                       k->h[top_power]), k->h[top_power - 1], 1), k->h[top_power - 2], 2), k->h[top_power - 3], 3);
    }
}

FAST_TARGET static inline __m128i fold4(__m512i z) {
    __m256i y = _mm256_xor_si256(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
    return _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

/* the 16-byte tag of data[0:len] under nonce 4 zero bytes + seq (big-endian) */
FAST_TARGET static void fast_tag(const FastKey *k, uint64_t seq, const unsigned char *data, size_t len,
                                 unsigned char *tag) {
    const __m512i swap = _mm512_broadcast_i32x4(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m128i x = _mm_setzero_si128();
    size_t off = 0;
    for (; off + 16 * FAST_POWERS <= len; off += 16 * FAST_POWERS) {
        __m512i lo = _mm512_setzero_si512(), mi = lo, hi = lo;
        for (int j = 0; j < FAST_POWERS / 4; j++) {
            __m512i b = _mm512_shuffle_epi8(_mm512_loadu_si512((const void *)(data + off + 64 * j)), swap);
            if (j == 0) b = _mm512_xor_si512(b, _mm512_zextsi128_si512(x));
            lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(b, k->hz[j], 0x00));
            hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(b, k->hz[j], 0x11));
            mi = _mm512_xor_si512(mi, _mm512_xor_si512(_mm512_clmulepi64_epi128(b, k->hz[j], 0x01),
                                                       _mm512_clmulepi64_epi128(b, k->hz[j], 0x10)));
        }
        x = ghash_reduce(fold4(lo), fold4(mi), fold4(hi));
    }
    for (; off + 16 <= len; off += 16)
        x = ghash_mul(_mm_xor_si128(x, bswap128(_mm_loadu_si128((const __m128i *)(data + off)))), k->h[0]);
    if (off < len) {
        unsigned char last[16] = {0};
        memcpy(last, data + off, len - off);
        x = ghash_mul(_mm_xor_si128(x, bswap128(_mm_loadu_si128((const __m128i *)last))), k->h[0]);
    }
    unsigned char lengths[16] = {0};
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) lengths[i] = (unsigned char)(bits >> (56 - 8 * i));
    x = ghash_mul(_mm_xor_si128(x, bswap128(_mm_loadu_si128((const __m128i *)lengths))), k->h[0]);
    unsigned char j0[16] = {0};
    for (int i = 0; i < 8; i++) j0[4 + i] = (unsigned char)(seq >> (56 - 8 * i));
    j0[15] = 1;
    __m128i mask = aes256_block(k, _mm_loadu_si128((const __m128i *)j0));
    _mm_storeu_si128((__m128i *)tag, _mm_xor_si128(bswap128(x), mask));
}

static int fast_supported(void) {
    static int supported = -1; /* the CPU does not change: asked once per process */
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") &&
                    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("vpclmulqdq");
    }
    return supported;
}

#else /* not x86-64: OpenSSL's EVP only */
typedef struct {
    int unused;
} FastKey;
static void fast_init(FastKey *k, const unsigned char *key) { (void)k; (void)key; }
static void fast_tag(const FastKey *k, uint64_t seq, const unsigned char *data, size_t len, unsigned char *tag) {
    (void)k; (void)seq; (void)data; (void)len; (void)tag;
}
static int fast_supported(void) { return 0; }
#endif

/* ------------------------------------------------------------------ Gmac */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *ctx; /* OpenSSL's AES-256-GCM: always set up (the portable path) */
    FastKey *fast;       /* the fast path's keys where the CPU has it (and it was not refused) */
} GmacObject;

static void Gmac_dealloc(GmacObject *self) {
    if (self->ctx) EVP_CIPHER_CTX_free(self->ctx);
    if (self->fast) {
        OPENSSL_cleanse(self->fast, sizeof *self->fast);
        free(self->fast);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Gmac_init(GmacObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key", "portable", NULL};
    Py_buffer key;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|p", kwlist, &key, &portable)) return -1;
    if (key.len != 32) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "an AES-256-GMAC key is 32 bytes");
        return -1;
    }
    if (self->ctx == NULL) self->ctx = EVP_CIPHER_CTX_new();
    int ok = self->ctx != NULL && EVP_EncryptInit_ex(self->ctx, EVP_aes_256_gcm(), NULL, key.buf, NULL) == 1;
    if (ok && !portable && fast_supported()) {
        if (self->fast == NULL && posix_memalign((void **)&self->fast, 64, sizeof *self->fast) != 0) self->fast = NULL;
        if (self->fast != NULL) fast_init(self->fast, key.buf);
    } else if (self->fast != NULL) {
        OPENSSL_cleanse(self->fast, sizeof *self->fast);
        free(self->fast);
        self->fast = NULL;
    }
    PyBuffer_Release(&key);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-256-GCM");
        return -1;
    }
    return 0;
}

/* The tag of ``aad`` under nonce 4 zero bytes + ``seq`` (big-endian): wire._data_tag. */
static int gmac_tag(GmacObject *g, uint64_t seq, const unsigned char *aad, int len, unsigned char *tag) {
    if (g->fast) {
        fast_tag(g->fast, seq, aad, (size_t)len, tag);
        return 1;
    }
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

static PyObject *Gmac_get_fast(GmacObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->fast != NULL);
}

static PyGetSetDef Gmac_getset[] = {
    {"fast", (getter)Gmac_get_fast, NULL, "whether tags take the VPCLMULQDQ/AES-NI path (else OpenSSL's EVP)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Gmac_methods[] = {
    {"tag", (PyCFunction)Gmac_tag, METH_VARARGS, "tag(seq, data): the 16-byte AES-256-GMAC tag of data"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GmacType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostagent._fastrun.Gmac",
    .tp_basicsize = sizeof(GmacObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Gmac(key, portable=False): AES-256-GMAC under one session's key (VPCLMULQDQ/AES-NI where the CPU has them, unless portable; else one reused OpenSSL context)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Gmac_init,
    .tp_dealloc = (destructor)Gmac_dealloc,
    .tp_methods = Gmac_methods,
    .tp_getset = Gmac_getset,
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
