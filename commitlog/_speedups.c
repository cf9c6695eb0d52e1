/* Optional compiled fast path of the commit log's per-record loops.
 *
 * Every function here is a "fast-forward" over the records the pure-Python loop would
 * handle without any special case: it processes records until it meets one that needs
 * anything else (an error, a control record, an index entry, an unknown key, an odd type
 * or value) and returns the position of that record WITHOUT having changed any state for
 * it. The Python loop that called it then handles that one record with its own code, so
 * every error is raised by the same Python line with the same message and position, and
 * every rare branch stays in Python. The pure-Python code (commitlog/record.py,
 * store.py, fetch.py) is the reference; see commitlog/README.md.
 *
 * The record layout (little-endian, 34-byte header) is documented in record.py.
 * The CRC is zlib's crc32, the same function Python's zlib.crc32 calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY: DeviceLog's slots (c_append) */
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define HEADER_SIZE 34
#define MAGIC 1
#define FLAG_CONTROL 0x01

static PyTypeObject *RecordType = NULL; /* commitlog.record.Record, set by setup() */
static PyObject *EmptyTuple = NULL;
static PyObject *One = NULL;
static PyObject *s_since_idx, *s_total, *s_max_ts, *s_next, *s_durable_end, *s_seg_base,
    *s_apos_base, *s_apos, *s_frombytes, *s_kb, *s_pend, *s_cache, *s_cache_bytes, *s__broken,
    *s__devices, *s__pend_devs, *s__pend_n, *s__pend_bound, *s__cache_on, *s__cache_total;

/* ------------------------------------------------------------------ helpers */

static inline uint16_t rd16(const unsigned char *b) { return (uint16_t)(b[0] | (b[1] << 8)); }
static inline uint32_t rd32(const unsigned char *b)
{
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
           ((uint32_t)b[3] << 24);
}
static inline int64_t rd64(const unsigned char *b)
{
    return (int64_t)((uint64_t)rd32(b) | ((uint64_t)rd32(b + 4) << 32));
}
static inline void wr16(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
}
static inline void wr32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
    b[2] = (unsigned char)(v >> 16);
    b[3] = (unsigned char)(v >> 24);
}
static inline void wr64(unsigned char *b, int64_t v)
{
    wr32(b, (uint32_t)((uint64_t)v & 0xFFFFFFFFu));
    wr32(b + 4, (uint32_t)((uint64_t)v >> 32));
}

static uint32_t crc(const unsigned char *p, Py_ssize_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

typedef struct {
    int32_t length;
    uint32_t len_u, crc;
    unsigned magic, flags, attrs, kl, tl, hc;
    int64_t off, ts;
} Hdr;

static inline void unpack_header(const unsigned char *b, Hdr *h)
{
    h->len_u = rd32(b);
    h->crc = rd32(b + 4);
    h->magic = b[8];
    h->flags = b[9];
    h->attrs = rd16(b + 10);
    h->off = rd64(b + 12);
    h->ts = rd64(b + 20);
    h->kl = rd16(b + 28);
    h->tl = rd16(b + 30);
    h->hc = rd16(b + 32);
}

/* The one framing rule every reader applies: the record's length covers at least the header,
 * it ends inside ``limit``, and its magic is ours. Sets *rend (the byte after the record).
 * Each caller keeps its own reaction (stop for the Python loop, truncate, skip). */
static inline int frame_ok(const Hdr *h, Py_ssize_t pos, Py_ssize_t limit, Py_ssize_t *rend)
{
    *rend = pos + 4 + (Py_ssize_t)h->len_u;
    return h->len_u >= HEADER_SIZE - 4 && *rend <= limit && h->magic == MAGIC;
}

/* A Record (tuple subclass) from 7 new references (stolen); NULL on error. */
static PyObject *make_record(PyObject *off, PyObject *ts, PyObject *key, PyObject *topic,
                             PyObject *attrs, PyObject *headers, PyObject *payload)
{
    PyObject *r = RecordType->tp_alloc(RecordType, 7);
    if (r == NULL) {
        Py_XDECREF(off); Py_XDECREF(ts); Py_XDECREF(key); Py_XDECREF(topic);
        Py_XDECREF(attrs); Py_XDECREF(headers); Py_XDECREF(payload);
        return NULL;
    }
    PyTuple_SET_ITEM(r, 0, off);
    PyTuple_SET_ITEM(r, 1, ts);
    PyTuple_SET_ITEM(r, 2, key);
    PyTuple_SET_ITEM(r, 3, topic);
    PyTuple_SET_ITEM(r, 4, attrs);
    PyTuple_SET_ITEM(r, 5, headers);
    PyTuple_SET_ITEM(r, 6, payload);
    if (off == NULL || ts == NULL || key == NULL || topic == NULL || attrs == NULL ||
        headers == NULL || payload == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    /* A record without headers holding only ints, str and bytes: it cannot be part of a
     * reference cycle, so the cyclic GC need not track it (CPython untracks such plain
     * tuples itself, but only exact tuples and only when a collection reaches them).
     * Reading 1M records otherwise spends ~40% of its time in collections walking them. */
    if (headers == EmptyTuple && !PyObject_IS_GC(off) && !PyObject_IS_GC(ts) &&
        !PyObject_IS_GC(key) && !PyObject_IS_GC(topic) && !PyObject_IS_GC(attrs) &&
        !PyObject_IS_GC(payload))
        PyObject_GC_UnTrack(r);
    return r;
}

/* Decode the headers at b[q:] (count hc) without passing ``limit``. Returns a new list,
 * or NULL with *defer set (malformed: the Python loop handles it) or with an exception
 * (memory). *qp is advanced. */
static PyObject *decode_headers(const unsigned char *b, Py_ssize_t *qp, Py_ssize_t limit,
                                unsigned hc, int *defer)
{
    Py_ssize_t q = *qp;
    PyObject *list = PyList_New(hc);
    if (list == NULL)
        return NULL;
    for (unsigned i = 0; i < hc; i++) {
        if (q + 6 > limit)
            goto bad;
        Py_ssize_t nl = rd16(b + q), vl = rd32(b + q + 2);
        q += 6;
        if (nl > limit - q || vl > limit - q - nl)
            goto bad;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)b + q, nl, NULL);
        if (name == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                goto bad;
            }
            Py_DECREF(list);
            return NULL;
        }
        q += nl;
        PyObject *value = PyBytes_FromStringAndSize((const char *)b + q, vl);
        q += vl;
        PyObject *t = value ? PyTuple_Pack(2, name, value) : NULL;
        Py_DECREF(name);
        Py_XDECREF(value);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    *qp = q;
    return list;
bad:
    Py_DECREF(list);
    *defer = 1;
    return NULL;
}

/* Small cache: the last decoded string for a byte range (keys and topics repeat). */
typedef struct {
    PyObject *str;
    PyObject *raw; /* bytes of the last decoded value */
} StrCache;

static void cache_clear(StrCache *c)
{
    Py_CLEAR(c->str);
    Py_CLEAR(c->raw);
}

/* New reference to the str for b[0:n]; NULL with *defer (invalid UTF-8) or exception. */
static PyObject *cached_str(StrCache *c, const unsigned char *b, Py_ssize_t n, int *defer)
{
    if (c->raw != NULL && PyBytes_GET_SIZE(c->raw) == n &&
        memcmp(PyBytes_AS_STRING(c->raw), b, (size_t)n) == 0) {
        Py_INCREF(c->str);
        return c->str;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)b, n, NULL);
    if (s == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *defer = 1;
        }
        return NULL;
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)b, n);
    if (raw == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    Py_XSETREF(c->str, s);
    Py_XSETREF(c->raw, raw);
    Py_INCREF(s);
    return s;
}

static int get_buffer_ro(PyObject *o, Py_buffer *view)
{
    return PyObject_GetBuffer(o, view, PyBUF_SIMPLE);
}

/* ------------------------------------------------------------------ setup */

static PyObject *py_setup(PyObject *self, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) ||
        ((PyTypeObject *)cls)->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "setup() needs a tuple subclass without __dict__");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(RecordType, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

static int need_setup(void)
{
    if (RecordType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "commitlog._speedups.setup(Record) not called");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ encode (flush) */

/* Checked int conversion; 0 on success, -1 if not an int or out of range (no error set). */
static int as_i64(PyObject *o, int64_t *out)
{
    if (!PyLong_Check(o))
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

/* UTF-8 of a str (cached in the str object); -1 (no error set) if not encodable. */
static int utf8_of(PyObject *s, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_Check(s))
        return -1;
    *p = PyUnicode_AsUTF8AndSize(s, n);
    if (*p == NULL) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* encode_run(buf, p, recs, i, kb, since, interval, total, dmax, rel0)
 *     -> (i, p, since, total, dmax, positions: bytes | None)
 *
 * The inner loop of LogStore.flush for one device's records recs[i:]: encodes records
 * at buf[p:] (framing, CRC) while no index entry is due (since < interval) and the
 * record holds only the plain types the loop expects; returns where it stopped. With
 * rel0 >= 0 it also returns the records' position entries ((rel0 + p) << 32 | size)
 * as int64 bytes for array.frombytes. */
static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "encode_run takes 10 arguments");
        return NULL;
    }
    PyObject *bufo = args[0], *recs = args[2], *kbo = args[4];
    if (!PyByteArray_Check(bufo) || !PyList_Check(recs) || !PyBytes_Check(kbo)) {
        PyErr_SetString(PyExc_TypeError, "encode_run(bytearray, int, list, int, bytes, ...)");
        return NULL;
    }
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    long long since = PyLong_AsLongLong(args[5]);
    long long interval = PyLong_AsLongLong(args[6]);
    long long total = PyLong_AsLongLong(args[7]);
    long long dmax = PyLong_AsLongLong(args[8]);
    long long rel0 = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred())
        return NULL;
    unsigned char *buf = (unsigned char *)PyByteArray_AS_STRING(bufo);
    Py_ssize_t buflen = PyByteArray_GET_SIZE(bufo);
    const char *kb = PyBytes_AS_STRING(kbo);
    Py_ssize_t kl = PyBytes_GET_SIZE(kbo);
    Py_ssize_t nrec = PyList_GET_SIZE(recs);
    if (p < 0 || i < 0 || kl > 0xFFFF)
        goto done_early;

    int64_t *pos_out = NULL;
    Py_ssize_t npos = 0, pos_cap = 0;
    PyObject *posb = NULL;
    if (rel0 >= 0 && nrec > i) {
        pos_cap = nrec - i;
        pos_out = PyMem_Malloc(sizeof(int64_t) * (size_t)pos_cap);
        if (pos_out == NULL)
            return PyErr_NoMemory();
    }
    for (; i < nrec; i++) {
        if (since >= interval)
            break;
        PyObject *rec = PyList_GET_ITEM(recs, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 7)
            break;
        int64_t off, ts, attrs;
        const char *tp;
        Py_ssize_t tl;
        PyObject *hdrs = PyTuple_GET_ITEM(rec, 5), *payload = PyTuple_GET_ITEM(rec, 6);
        if (as_i64(PyTuple_GET_ITEM(rec, 0), &off) || as_i64(PyTuple_GET_ITEM(rec, 1), &ts) ||
            as_i64(PyTuple_GET_ITEM(rec, 4), &attrs) || attrs < 0 || attrs > 0xFFFF ||
            utf8_of(PyTuple_GET_ITEM(rec, 3), &tp, &tl) || tl > 0xFFFF ||
            !PyBytes_Check(payload))
            break;
        Py_ssize_t hc = 0, hbytes = 0;
        int ok = 1;
        if (PyTuple_Check(hdrs) || PyList_Check(hdrs)) {
            hc = PySequence_Fast_GET_SIZE(hdrs);
            if (hc > 0xFFFF)
                break;
            for (Py_ssize_t h = 0; h < hc; h++) {
                PyObject *pair = PySequence_Fast_GET_ITEM(hdrs, h);
                const char *np;
                Py_ssize_t nl;
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                    utf8_of(PyTuple_GET_ITEM(pair, 0), &np, &nl) || nl > 0xFFFF ||
                    !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)) ||
                    PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) > (Py_ssize_t)0xFFFFFFFF) {
                    ok = 0;
                    break;
                }
                hbytes += 6 + nl + PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1));
            }
        } else {
            ok = 0;
        }
        if (!ok)
            break;
        Py_ssize_t pl = PyBytes_GET_SIZE(payload);
        Py_ssize_t n = HEADER_SIZE + kl + tl + hbytes + pl;
        if (n - 4 > (Py_ssize_t)0xFFFFFFFF || n > buflen - p)
            break;
        unsigned char *r = buf + p;
        unsigned char *q = r + HEADER_SIZE;
        memcpy(q, kb, (size_t)kl);
        q += kl;
        memcpy(q, tp, (size_t)tl);
        q += tl;
        for (Py_ssize_t h = 0; h < hc; h++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(hdrs, h);
            const char *np = NULL;
            Py_ssize_t nl = 0;
            PyObject *v = PyTuple_GET_ITEM(pair, 1);
            utf8_of(PyTuple_GET_ITEM(pair, 0), &np, &nl); /* checked above */
            Py_ssize_t vl = PyBytes_GET_SIZE(v);
            wr16(q, (uint32_t)nl);
            wr32(q + 2, (uint32_t)vl);
            q += 6;
            memcpy(q, np, (size_t)nl);
            q += nl;
            memcpy(q, PyBytes_AS_STRING(v), (size_t)vl);
            q += vl;
        }
        memcpy(q, PyBytes_AS_STRING(payload), (size_t)pl);
        wr32(r, (uint32_t)(n - 4));
        r[8] = MAGIC;
        r[9] = 0;
        wr16(r + 10, (uint32_t)attrs);
        wr64(r + 12, off);
        wr64(r + 20, ts);
        wr16(r + 28, (uint32_t)kl);
        wr16(r + 30, (uint32_t)tl);
        wr16(r + 32, (uint32_t)hc);
        wr32(r + 4, crc(r + 8, n - 8));
        since += n;
        total += n;
        if (ts > dmax)
            dmax = ts;
        if (pos_out != NULL)
            pos_out[npos++] = (int64_t)(((uint64_t)(rel0 + p) << 32) | (uint64_t)n);
        p += n;
    }
    if (pos_out != NULL) {
        posb = PyBytes_FromStringAndSize((const char *)pos_out, (Py_ssize_t)sizeof(int64_t) * npos);
        PyMem_Free(pos_out);
        if (posb == NULL)
            return NULL;
    } else {
        posb = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(nnLLLN)", i, p, since, total, dmax, posb);
done_early:
    return Py_BuildValue("(nnLLLO)", i, p, since, total, dmax, Py_None);
}

/* ------------------------------------------------------------------ decode_batch */

/* decode_run(buf, pos, end, verify, out) -> pos
 *
 * The loop of record.decode_batch: decodes records of buf[pos:end] into ``out``
 * (control records skipped) until one would take any error or odd path. */
static PyObject *py_decode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "decode_run(buf, pos, end, verify, out: list)");
        return NULL;
    }
    if (need_setup())
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    int verify = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || verify < 0)
        return NULL;
    PyObject *out = args[4];
    Py_buffer view;
    if (get_buffer_ro(args[0], &view))
        return NULL;
    const unsigned char *b = view.buf;
    if (end > view.len)
        end = view.len;
    StrCache kc = {0}, tc = {0};
    PyObject *result = NULL;
    while (pos >= 0 && pos < end) {
        if (end - pos < HEADER_SIZE)
            break;
        Hdr h;
        unpack_header(b + pos, &h);
        Py_ssize_t rend;
        if (!frame_ok(&h, pos, end, &rend))
            break;
        if (verify && crc(b + pos + 8, rend - pos - 8) != h.crc)
            break;
        Py_ssize_t q = pos + HEADER_SIZE;
        if ((Py_ssize_t)h.kl + h.tl > rend - q)
            break;
        int defer = 0;
        PyObject *key = cached_str(&kc, b + q, h.kl, &defer);
        if (key == NULL) {
            if (defer)
                break;
            goto error;
        }
        q += h.kl;
        PyObject *topic = cached_str(&tc, b + q, h.tl, &defer);
        if (topic == NULL) {
            Py_DECREF(key);
            if (defer)
                break;
            goto error;
        }
        q += h.tl;
        PyObject *headers;
        if (h.hc) {
            headers = decode_headers(b, &q, rend, h.hc, &defer);
            if (headers == NULL) {
                Py_DECREF(key);
                Py_DECREF(topic);
                if (defer)
                    break;
                goto error;
            }
        } else {
            headers = Py_NewRef(EmptyTuple);
        }
        if (!(h.flags & FLAG_CONTROL)) {
            PyObject *r = make_record(
                PyLong_FromLongLong(h.off), PyLong_FromLongLong(h.ts), key, topic,
                PyLong_FromLong((long)h.attrs), headers,
                PyBytes_FromStringAndSize((const char *)b + q, rend - q));
            if (r == NULL)
                goto error;
            int rc = PyList_Append(out, r);
            Py_DECREF(r);
            if (rc)
                goto error;
        } else {
            Py_DECREF(key);
            Py_DECREF(topic);
            Py_DECREF(headers);
        }
        pos = rend;
    }
    result = PyLong_FromSsize_t(pos);
error:
    cache_clear(&kc);
    cache_clear(&tc);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ device read */

/* read_run(data, p, kb, key, want, upto, used, max_bytes, out) -> (p, want, used, done)
 *
 * The inner loop of LogStore._read_positions (device without truncation markers): the
 * records in ``data`` must all be this device's, at consecutive offsets from ``want``.
 * Decodes and appends them to ``out`` until ``upto``/``max_bytes`` is reached
 * (done=True, after the record that reached it) or a record needs the Python loop
 * (a check that fails, the byte cap before it, anything odd). */
static PyObject *py_read_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2]) ||
        !PyUnicode_Check(args[3]) || !PyList_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_run(bytes, p, kb: bytes, key: str, want, upto, used, max, list)");
        return NULL;
    }
    if (need_setup())
        return NULL;
    PyObject *data = args[0], *kbo = args[2], *key = args[3], *out = args[8];
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    long long want = PyLong_AsLongLong(args[4]);
    long long upto = PyLong_AsLongLong(args[5]);
    long long used = PyLong_AsLongLong(args[6]);
    long long max_bytes = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t dn = PyBytes_GET_SIZE(data);
    const char *kb = PyBytes_AS_STRING(kbo);
    Py_ssize_t klen = PyBytes_GET_SIZE(kbo);
    StrCache tc = {0};
    int done = 0;
    while (p >= 0 && p < dn) {
        if (dn - p < HEADER_SIZE)
            break;
        Hdr h;
        unpack_header(b + p, &h);
        Py_ssize_t rend;
        int framed = frame_ok(&h, p, dn, &rend);
        Py_ssize_t q = p + HEADER_SIZE;
        if (!framed || (Py_ssize_t)h.kl != klen || (h.flags & FLAG_CONTROL) || klen > rend - q ||
            memcmp(b + q, kb, (size_t)klen) != 0)
            break;
        if (h.off != want)
            break;
        long long rlen = (long long)h.len_u + 4;
        if (PyList_GET_SIZE(out) && used + rlen > max_bytes)
            break;
        if (crc(b + p + 8, rend - p - 8) != h.crc)
            break;
        q += klen;
        if ((Py_ssize_t)h.tl > rend - q)
            break;
        int defer = 0;
        PyObject *topic = cached_str(&tc, b + q, h.tl, &defer);
        if (topic == NULL) {
            if (defer)
                break;
            goto error;
        }
        q += h.tl;
        PyObject *headers;
        if (h.hc) {
            headers = decode_headers(b, &q, rend, h.hc, &defer);
            if (headers == NULL) {
                Py_DECREF(topic);
                if (defer)
                    break;
                goto error;
            }
        } else {
            headers = Py_NewRef(EmptyTuple);
        }
        PyObject *r = make_record(PyLong_FromLongLong(h.off), PyLong_FromLongLong(h.ts),
                                  Py_NewRef(key), topic, PyLong_FromLong((long)h.attrs),
                                  headers,
                                  PyBytes_FromStringAndSize((const char *)b + q, rend - q));
        if (r == NULL)
            goto error;
        int rc = PyList_Append(out, r);
        Py_DECREF(r);
        if (rc)
            goto error;
        used += rlen;
        want += 1;
        p = rend;
        if (want >= upto || used >= max_bytes) {
            done = 1;
            break;
        }
    }
    cache_clear(&tc);
    return Py_BuildValue("(nLLO)", p, want, used, done ? Py_True : Py_False);
error:
    cache_clear(&tc);
    return NULL;
}

/* ------------------------------------------------------------------ recovery scan */

/* Per-device state the scan works on, loaded from / stored back to a DeviceLog. */
typedef struct {
    PyObject *dev;      /* borrowed from by_kb */
    const char *kb;     /* the dict key's bytes (borrowed) */
    Py_ssize_t kl;
    long long since, total, max_ts, next, seg_base, apos_base;
    PyObject *apos;     /* new reference or NULL */
    int64_t *pbuf;      /* positions to append to apos */
    Py_ssize_t np, cap;
} DevState;

static int get_ll(PyObject *o, PyObject *name, long long *v)
{
    PyObject *x = PyObject_GetAttr(o, name);
    if (x == NULL)
        return -1;
    *v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *o, PyObject *name, long long v)
{
    PyObject *x = PyLong_FromLongLong(v);
    if (x == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, name, x);
    Py_DECREF(x);
    return rc;
}

static int dev_load(DevState *d, PyObject *dev, PyObject *kbo)
{
    d->dev = dev;
    d->kb = PyBytes_AS_STRING(kbo);
    d->kl = PyBytes_GET_SIZE(kbo);
    d->np = 0;
    if (get_ll(dev, s_since_idx, &d->since) || get_ll(dev, s_total, &d->total) ||
        get_ll(dev, s_max_ts, &d->max_ts) || get_ll(dev, s_next, &d->next) ||
        get_ll(dev, s_seg_base, &d->seg_base) || get_ll(dev, s_apos_base, &d->apos_base))
        return -1;
    d->apos = PyObject_GetAttr(dev, s_apos);
    return d->apos == NULL ? -1 : 0;
}

/* Write the state back (only the fields the plain path changes). 0 / -1. */
static int dev_store(DevState *d, int changed)
{
    int rc = 0;
    if (d->dev == NULL)
        return 0;
    if (changed) {
        if (set_ll(d->dev, s_since_idx, d->since) || set_ll(d->dev, s_total, d->total) ||
            set_ll(d->dev, s_max_ts, d->max_ts) || set_ll(d->dev, s_next, d->next) ||
            set_ll(d->dev, s_durable_end, d->next))
            rc = -1;
        if (rc == 0 && d->np) {
            PyObject *bytes = PyBytes_FromStringAndSize((const char *)d->pbuf,
                                                        (Py_ssize_t)sizeof(int64_t) * d->np);
            PyObject *res = bytes ? PyObject_CallMethodOneArg(d->apos, s_frombytes, bytes)
                                  : NULL;
            Py_XDECREF(bytes);
            if (res == NULL)
                rc = -1;
            Py_XDECREF(res);
        }
    }
    d->np = 0;
    Py_CLEAR(d->apos);
    d->dev = NULL;
    return rc;
}

/* scan_run(data, p, by_kb, segb, interval, rel0, smax) -> (p, smax)
 *
 * The loop of LogStore._scan_tail (recovery): verifies and applies to the device
 * indexes every record that takes the plain path (known device, not a control record,
 * the expected offset, no index entry due, device positions already started in this
 * segment); stops at the first record that needs anything else, leaving it (and its
 * device's state) untouched for the Python loop. rel0 < 0: no position tracking. */
static PyObject *py_scan_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "scan_run(bytes, p, dict, segb, interval, rel0, smax)");
        return NULL;
    }
    PyObject *data = args[0], *by_kb = args[2];
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    long long segb = PyLong_AsLongLong(args[3]);
    long long interval = PyLong_AsLongLong(args[4]);
    long long rel0 = PyLong_AsLongLong(args[5]);
    long long smax = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    int track = rel0 >= 0;
    DevState d = {0};
    int changed = 0;
    while (p >= 0 && p < n) {
        if (n - p < HEADER_SIZE)
            break;
        Hdr h;
        unpack_header(b + p, &h);
        Py_ssize_t end;
        if (!frame_ok(&h, p, n, &end))
            break;
        if (crc(b + p + 8, end - p - 8) != h.crc)
            break;
        const unsigned char *kp = b + p + HEADER_SIZE;
        if ((Py_ssize_t)h.kl > end - (p + HEADER_SIZE))
            break;
        if (d.dev == NULL || d.kl != (Py_ssize_t)h.kl || memcmp(d.kb, kp, h.kl) != 0) {
            if (dev_store(&d, changed))
                goto error;
            changed = 0;
            PyObject *kbo = PyBytes_FromStringAndSize((const char *)kp, h.kl);
            if (kbo == NULL)
                goto error;
            PyObject *dev = PyDict_GetItemWithError(by_kb, kbo);
            Py_DECREF(kbo);
            if (dev == NULL) {
                if (PyErr_Occurred())
                    goto error;
                break; /* new device: created by the Python loop */
            }
            /* borrow the dict's own key bytes so kb stays valid */
            PyObject *devkb = PyObject_GetAttrString(dev, "kb");
            if (devkb == NULL)
                goto error;
            if (!PyBytes_Check(devkb)) {
                Py_DECREF(devkb);
                break;
            }
            Py_DECREF(devkb); /* the DeviceLog holds it */
            if (dev_load(&d, dev, devkb)) {
                d.dev = NULL;
                Py_CLEAR(d.apos);
                goto error;
            }
            if (d.kl != (Py_ssize_t)h.kl || memcmp(d.kb, kp, h.kl) != 0) {
                dev_store(&d, 0);
                break;
            }
        }
        if ((h.flags & FLAG_CONTROL) || h.off != d.next || d.since >= interval ||
            d.seg_base != segb)
            break;
        if (track) {
            if (d.apos_base != segb || d.apos == Py_None)
                break;
            if (d.np == d.cap) {
                Py_ssize_t cap = d.cap ? d.cap * 2 : 64;
                int64_t *nb = PyMem_Realloc(d.pbuf, sizeof(int64_t) * (size_t)cap);
                if (nb == NULL) {
                    PyErr_NoMemory();
                    goto error;
                }
                d.pbuf = nb;
                d.cap = cap;
            }
        }
        long long size = 4 + (long long)h.len_u;
        d.since += size;
        d.total += size;
        if (h.ts > d.max_ts)
            d.max_ts = h.ts;
        if (h.ts > smax)
            smax = h.ts;
        d.next = h.off + 1;
        if (track)
            d.pbuf[d.np++] = (int64_t)(((uint64_t)(rel0 + p) << 32) | (uint64_t)size);
        changed = 1;
        p = end;
    }
    if (dev_store(&d, changed))
        goto error;
    PyMem_Free(d.pbuf);
    return Py_BuildValue("(nL)", p, smax);
error:
    if (d.dev != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        dev_store(&d, changed);
        PyErr_Restore(et, ev, tb);
    }
    PyMem_Free(d.pbuf);
    return NULL;
}

/* ------------------------------------------------------------------ position walk */

/* walk_run(data, p, rel0, out: dict) -> p
 *
 * The loop of store.walk_positions: header-only walk that appends each non-control
 * record's position entry to out[key bytes] (an array('q') created by the caller's
 * ``new`` callable when missing); stops at the first record that fails the length or
 * magic check. */
static PyObject *py_walk_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "walk_run(bytes, p, rel0, dict, new)");
        return NULL;
    }
    PyObject *data = args[0], *out = args[3], *factory = args[4];
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    long long rel0 = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    /* Positions are gathered per key run and appended with one frombytes call. */
    PyObject *cur = NULL; /* borrowed array of the current key */
    PyObject *curkb = NULL; /* new ref: key bytes of cur */
    int64_t *pbuf = NULL;
    Py_ssize_t np = 0, cap = 0;
    PyObject *result = NULL;
#define FLUSH_RUN()                                                                     \
    do {                                                                                \
        if (cur != NULL && np) {                                                        \
            PyObject *bb = PyBytes_FromStringAndSize((const char *)pbuf,                \
                                                     (Py_ssize_t)sizeof(int64_t) * np); \
            PyObject *res = bb ? PyObject_CallMethodOneArg(cur, s_frombytes, bb) : NULL;\
            Py_XDECREF(bb);                                                             \
            if (res == NULL)                                                            \
                goto error;                                                             \
            Py_DECREF(res);                                                             \
        }                                                                               \
        np = 0;                                                                         \
    } while (0)
    while (p >= 0 && n - p >= HEADER_SIZE) {
        Hdr h;
        unpack_header(b + p, &h);
        Py_ssize_t end;
        if (!frame_ok(&h, p, n, &end))
            break;
        if (!(h.flags & FLAG_CONTROL)) {
            const unsigned char *kp = b + p + HEADER_SIZE;
            Py_ssize_t kl = h.kl;
            if (kl > n - (p + HEADER_SIZE))
                kl = n - (p + HEADER_SIZE); /* a slice stops at the end of the data */
            if (curkb == NULL || PyBytes_GET_SIZE(curkb) != kl ||
                memcmp(PyBytes_AS_STRING(curkb), kp, (size_t)kl) != 0) {
                FLUSH_RUN();
                PyObject *kbo = PyBytes_FromStringAndSize((const char *)kp, kl);
                if (kbo == NULL)
                    goto error;
                PyObject *arr = PyDict_GetItemWithError(out, kbo);
                if (arr == NULL) {
                    if (PyErr_Occurred()) {
                        Py_DECREF(kbo);
                        goto error;
                    }
                    arr = PyObject_CallNoArgs(factory);
                    if (arr == NULL || PyDict_SetItem(out, kbo, arr)) {
                        Py_XDECREF(arr);
                        Py_DECREF(kbo);
                        goto error;
                    }
                    Py_DECREF(arr); /* the dict holds it */
                }
                cur = arr;
                Py_XSETREF(curkb, kbo);
            }
            if (np == cap) {
                Py_ssize_t ncap = cap ? cap * 2 : 256;
                int64_t *nb = PyMem_Realloc(pbuf, sizeof(int64_t) * (size_t)ncap);
                if (nb == NULL) {
                    PyErr_NoMemory();
                    goto error;
                }
                pbuf = nb;
                cap = ncap;
            }
            pbuf[np++] = (int64_t)(((uint64_t)(rel0 + p) << 32) | (uint64_t)(end - p));
        }
        p = end;
    }
    FLUSH_RUN();
    result = PyLong_FromSsize_t(p);
error:
#undef FLUSH_RUN
    Py_XDECREF(curkb);
    PyMem_Free(pbuf);
    return result;
}

/* ------------------------------------------------------------------ columnar fetch */

/* columns_run(buf, pos, end, verify, with_headers, cols: tuple of 8 lists) -> pos
 *
 * The loop of fetch.decode_fetch_columns: appends each plain record's fields to the
 * column lists (keys, offsets, timestamps, topics, qos, retain, payloads, headers);
 * control records are skipped once their length, magic and CRC are checked. */
static PyObject *py_columns_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 8) {
        PyErr_SetString(PyExc_TypeError, "columns_run(buf, pos, end, verify, with_headers, cols)");
        return NULL;
    }
    PyObject *cols[8];
    for (int c = 0; c < 8; c++) {
        cols[c] = PyTuple_GET_ITEM(args[5], c);
        if (!PyList_Check(cols[c])) {
            PyErr_SetString(PyExc_TypeError, "columns must be lists");
            return NULL;
        }
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    int verify = PyObject_IsTrue(args[3]);
    int with_headers = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || verify < 0 || with_headers < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer_ro(args[0], &view))
        return NULL;
    const unsigned char *b = view.buf;
    if (end > view.len)
        end = view.len;
    StrCache kc = {0}, tc = {0};
    PyObject *result = NULL;
    while (pos >= 0 && pos < end) {
        if (end - pos < HEADER_SIZE)
            break;
        Hdr h;
        unpack_header(b + pos, &h);
        Py_ssize_t rend;
        if (!frame_ok(&h, pos, end, &rend))
            break;
        if (verify && crc(b + pos + 8, rend - pos - 8) != h.crc)
            break;
        if (h.flags & FLAG_CONTROL) {
            pos = rend;
            continue;
        }
        Py_ssize_t q = pos + HEADER_SIZE;
        if ((Py_ssize_t)h.kl + h.tl > rend - q)
            break;
        int defer = 0;
        PyObject *v[8] = {NULL};
        v[0] = cached_str(&kc, b + q, h.kl, &defer);
        if (v[0] == NULL)
            goto fail;
        q += h.kl;
        v[3] = cached_str(&tc, b + q, h.tl, &defer);
        if (v[3] == NULL)
            goto fail;
        q += h.tl;
        if (h.hc) {
            v[7] = decode_headers(b, &q, rend, h.hc, &defer);
            if (v[7] == NULL)
                goto fail;
        } else {
            v[7] = PyList_New(0);
            if (v[7] == NULL)
                goto fail;
        }
        v[1] = PyLong_FromLongLong(h.off);
        v[2] = PyLong_FromLongLong(h.ts);
        v[4] = PyLong_FromLong((long)(h.attrs & 0x03));
        v[5] = Py_NewRef((h.attrs & 0x04) ? Py_True : Py_False);
        v[6] = PyBytes_FromStringAndSize((const char *)b + q, rend - q);
        if (v[1] == NULL || v[2] == NULL || v[4] == NULL || v[6] == NULL)
            goto fail;
        for (int c = 0; c < (with_headers ? 8 : 7); c++) {
            if (PyList_Append(cols[c], v[c]))
                goto fail; /* cannot happen short of memory; the columns are then dropped */
        }
        for (int c = 0; c < 8; c++)
            Py_DECREF(v[c]);
        pos = rend;
        continue;
    fail:
        for (int c = 0; c < 8; c++)
            Py_XDECREF(v[c]);
        if (defer && !PyErr_Occurred())
            break;
        goto error;
    }
    result = PyLong_FromSsize_t(pos);
error:
    cache_clear(&kc);
    cache_clear(&tc);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ append */

static int incr_attr(PyObject *o, PyObject *name, long long delta)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    PyObject *d = PyLong_FromLongLong(delta);
    PyObject *nv = d ? PyNumber_Add(v, d) : NULL;
    Py_DECREF(v);
    Py_XDECREF(d);
    if (nv == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, name, nv);
    Py_DECREF(nv);
    return rc;
}

/* Direct attribute access for c_append (issue 25: its ~20 generic getattr/setattr per record
 * were most of the 0.32 us a logged publish spent in it). A DeviceLog's fields are __slots__:
 * their member offsets are looked up once per type and read and written in place. The
 * store's fields live in its instance dict: read and written there, once its type is known
 * to define none of those names (a property or slot of that name would be bypassed). A
 * type that is neither (a subclass with its own descriptors, say) takes the generic calls,
 * exactly as before. */
typedef struct {
    PyTypeObject *type; /* the DeviceLog type these offsets are for (a strong reference) */
    Py_ssize_t next, kb, pend, cache, cache_bytes;
} DevSlots;
static DevSlots dev_slots;
static PyTypeObject *plain_store_type = NULL; /* a LogStore type checked as above */
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static Py_ssize_t member_offset(PyTypeObject *tp, PyObject *name)
{
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type)
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY))
        return -1;
    return m->offset;
}

static int dev_is_slotted(PyTypeObject *tp)
{
    if (dev_slots.type == tp)
        return 1;
    DevSlots d = {tp, member_offset(tp, s_next), member_offset(tp, s_kb),
                  member_offset(tp, s_pend), member_offset(tp, s_cache),
                  member_offset(tp, s_cache_bytes)};
    if (d.next < 0 || d.kb < 0 || d.pend < 0 || d.cache < 0 || d.cache_bytes < 0)
        return 0;
    Py_INCREF(tp);
    Py_XDECREF(dev_slots.type);
    dev_slots = d;
    return 1;
}

static int store_is_plain(PyTypeObject *tp)
{
    if (plain_store_type == tp)
        return 1;
    PyObject *names[] = {s__broken, s__devices, s__pend_devs, s__pend_n, s__pend_bound,
                         s__cache_on, s__cache_total};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (_PyType_Lookup(tp, names[i]) != NULL)
            return 0;
    if (!(tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) && tp->tp_dictoffset == 0)
        return 0;
    Py_INCREF(tp);
    Py_XDECREF(plain_store_type);
    plain_store_type = tp;
    return 1;
}

/* d[name] = value, for the store's counters */
static int dict_set_ll(PyObject *d, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, name, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *c_append_generic(PyObject *fallback, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames, PyObject *hdrs, long long hsize);

/* LogStore.append (as made by make_append(fallback)): the method for the plain case, a
 * healthy store, a known device, a str topic, a bytes payload and no headers, or headers
 * that are a tuple or list of (str, bytes) tuples (the broker's own ``:pub`` on every QoS 1/2
 * publish: broker/pubdedupe.py). Anything else (and any call with keywords) calls
 * ``fallback``, the pure-Python method, with the same arguments before touching any state. */
static PyObject *c_append(PyObject *fallback, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 7 || kwnames != NULL || RecordType == NULL)
        return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
    PyObject *store = args[0], *key = args[1], *ts = args[2], *topic = args[3],
             *attrs = args[4], *headers = args[5], *payload = args[6];
    if (!PyUnicode_Check(topic) || !PyBytes_Check(payload) || !PyUnicode_CheckExact(key))
        return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
    /* headers_size(headers) of record.py, for the plain (str, bytes) pairs only */
    long long hsize = 0;
    PyObject *hdrs = EmptyTuple;
    if (headers != Py_None) {
        if (!(PyTuple_Check(headers) || PyList_Check(headers)))
            return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
        Py_ssize_t hn = PySequence_Fast_GET_SIZE(headers);
        for (Py_ssize_t i = 0; i < hn; i++) {
            PyObject *h = PySequence_Fast_GET_ITEM(headers, i);
            if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(h, 0)) ||
                !PyBytes_Check(PyTuple_GET_ITEM(h, 1)))
                return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
            hsize += 6 + 4 * (long long)PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(h, 0)) +
                     PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 1));
        }
        if (hn > 0)
            hdrs = headers; /* ``headers or ()`` */
    }
    if (!store_is_plain(Py_TYPE(store)))
        return c_append_generic(fallback, args, nargsf, kwnames, hdrs, hsize);
    PyObject *sd = PyObject_GenericGetDict(store, NULL); /* new reference */
    if (sd == NULL)
        return NULL;
    PyObject *rec = NULL, *result = NULL, *pend_new = NULL;
    /* every field read before any state changes: a missing one is the fallback's to raise */
    PyObject *broken = PyDict_GetItemWithError(sd, s__broken);
    PyObject *devices = broken ? PyDict_GetItemWithError(sd, s__devices) : NULL;
    PyObject *pend_devs = devices ? PyDict_GetItemWithError(sd, s__pend_devs) : NULL;
    PyObject *pend_n = pend_devs ? PyDict_GetItemWithError(sd, s__pend_n) : NULL;
    PyObject *pend_bound = pend_n ? PyDict_GetItemWithError(sd, s__pend_bound) : NULL;
    PyObject *cache_on = pend_bound ? PyDict_GetItemWithError(sd, s__cache_on) : NULL;
    PyObject *cache_total = cache_on ? PyDict_GetItemWithError(sd, s__cache_total) : NULL;
    if (cache_total == NULL || broken != Py_None || !PyDict_CheckExact(devices) ||
        !PyList_CheckExact(pend_devs) || !PyLong_CheckExact(pend_n) ||
        !PyLong_CheckExact(pend_bound) || !PyLong_CheckExact(cache_total))
        goto fallback;
    PyObject *dev = PyDict_GetItemWithError(devices, key); /* borrowed */
    if (dev == NULL)
        goto fallback; /* a new device (or an error the fallback meets again) */
    if (!dev_is_slotted(Py_TYPE(dev)))
        goto fallback;
    PyObject *next = SLOT(dev, dev_slots.next), *kb = SLOT(dev, dev_slots.kb),
             *pend = SLOT(dev, dev_slots.pend), *cache = SLOT(dev, dev_slots.cache),
             *cache_bytes = SLOT(dev, dev_slots.cache_bytes);
    if (next == NULL || !PyLong_CheckExact(next) || kb == NULL || !PyBytes_Check(kb) ||
        pend == NULL || !(pend == Py_None || PyList_CheckExact(pend)) || cache == NULL ||
        !PyList_CheckExact(cache) || cache_bytes == NULL || !PyLong_CheckExact(cache_bytes))
        goto fallback;
    int on = PyObject_IsTrue(cache_on);
    if (on < 0)
        goto error;
    /* Everything read is taken now, as numbers or strong references: the allocations below
     * may run the cyclic GC, and with it any finalizer, so nothing borrowed is used past
     * them. */
    long long n_pend = PyLong_AsLongLong(pend_n), n_bound = PyLong_AsLongLong(pend_bound),
              n_total = PyLong_AsLongLong(cache_total), n_cb = PyLong_AsLongLong(cache_bytes);
    if (PyErr_Occurred())
        goto error;
    long long tl = PyUnicode_GET_LENGTH(topic);
    long long size = HEADER_SIZE + PyBytes_GET_SIZE(kb) + tl + PyBytes_GET_SIZE(payload) +
                     hsize;
    Py_INCREF(dev);
    Py_INCREF(pend_devs);
    Py_INCREF(pend);
    Py_INCREF(cache);
    /* From here on: the same steps as LogStore.append. */
    PyObject *offset = Py_NewRef(next);
    PyObject *nnext = PyNumber_Add(next, One);
    if (nnext == NULL)
        goto fail_dev;
    Py_SETREF(SLOT(dev, dev_slots.next), nnext);
    rec = make_record(Py_NewRef(offset), Py_NewRef(ts), Py_NewRef(key), Py_NewRef(topic),
                      Py_NewRef(attrs), Py_NewRef(hdrs), Py_NewRef(payload));
    if (rec == NULL)
        goto fail_dev;
    /* Headers given as a tuple of (str, bytes) tuples (checked above) hold nothing that can
     * refer back to the record either: untracked as make_record does for no headers, so a
     * tail cache of such records costs the cyclic GC nothing (a list could be mutated). */
    if (hdrs != EmptyTuple && PyTuple_CheckExact(hdrs) && PyObject_GC_IsTracked(rec) &&
        !PyObject_IS_GC(offset) && !PyObject_IS_GC(ts) && !PyObject_IS_GC(key) &&
        !PyObject_IS_GC(topic) && !PyObject_IS_GC(attrs) && !PyObject_IS_GC(payload))
        PyObject_GC_UnTrack(rec);
    if (pend == Py_None) {
        pend_new = PyList_New(0);
        if (pend_new == NULL || PyList_Append(pend_devs, dev))
            goto fail_dev;
        Py_SETREF(SLOT(dev, dev_slots.pend), Py_NewRef(pend_new));
        Py_SETREF(pend, Py_NewRef(pend_new));
    }
    if (PyList_Append(pend, rec) || dict_set_ll(sd, s__pend_n, n_pend + 1) ||
        dict_set_ll(sd, s__pend_bound, n_bound + size + 3 * tl))
        goto fail_dev;
    if (on) {
        PyObject *ncb = PyLong_FromLongLong(n_cb + size);
        if (ncb == NULL)
            goto fail_dev;
        if (PyList_Append(cache, rec)) {
            Py_DECREF(ncb);
            goto fail_dev;
        }
        Py_SETREF(SLOT(dev, dev_slots.cache_bytes), ncb);
        if (dict_set_ll(sd, s__cache_total, n_total + size))
            goto fail_dev;
    }
    result = offset;
    offset = NULL;
fail_dev:
    Py_XDECREF(offset);
    Py_DECREF(cache);
    Py_DECREF(pend);
    Py_DECREF(pend_devs);
    Py_DECREF(dev);
error:
    Py_XDECREF(pend_new);
    Py_XDECREF(rec);
    Py_DECREF(sd);
    return result;
fallback:
    Py_DECREF(sd);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
}

/* c_append through the generic attribute calls (a store type with descriptors of those
 * names): the code before the direct access, unchanged. */
static PyObject *c_append_generic(PyObject *fallback, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames, PyObject *hdrs, long long hsize)
{
    PyObject *store = args[0], *key = args[1], *ts = args[2], *topic = args[3],
             *attrs = args[4], *payload = args[6];
    PyObject *devices = NULL, *dev = NULL, *next = NULL, *pend = NULL, *kb = NULL,
             *rec = NULL, *tmp = NULL, *result = NULL;
    int defer = 1;
    tmp = PyObject_GetAttr(store, s__broken);
    if (tmp == NULL)
        goto error;
    if (tmp != Py_None)
        goto done;
    Py_CLEAR(tmp);
    devices = PyObject_GetAttr(store, s__devices);
    if (devices == NULL)
        goto error;
    if (!PyDict_CheckExact(devices))
        goto done;
    dev = PyDict_GetItemWithError(devices, key);
    if (dev == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto done; /* new device */
    }
    Py_INCREF(dev);
    next = PyObject_GetAttr(dev, s_next);
    kb = next ? PyObject_GetAttr(dev, s_kb) : NULL;
    pend = kb ? PyObject_GetAttr(dev, s_pend) : NULL;
    if (pend == NULL)
        goto error;
    if (!PyLong_CheckExact(next) || !PyBytes_Check(kb) ||
        !(pend == Py_None || PyList_CheckExact(pend)))
        goto done;
    defer = 0;
    /* From here on: the same steps as LogStore.append. */
    tmp = PyNumber_Add(next, One);
    if (tmp == NULL || PyObject_SetAttr(dev, s_next, tmp))
        goto error;
    Py_CLEAR(tmp);
    rec = make_record(Py_NewRef(next), Py_NewRef(ts), Py_NewRef(key), Py_NewRef(topic),
                      Py_NewRef(attrs), Py_NewRef(hdrs), Py_NewRef(payload));
    if (rec == NULL)
        goto error;
    /* Headers given as a tuple of (str, bytes) tuples (checked above) hold nothing that can
     * refer back to the record either: untracked as make_record does for no headers, so a
     * tail cache of such records costs the cyclic GC nothing (a list could be mutated). */
    if (hdrs != EmptyTuple && PyTuple_CheckExact(hdrs) && PyObject_GC_IsTracked(rec) &&
        !PyObject_IS_GC(next) && !PyObject_IS_GC(ts) && !PyObject_IS_GC(key) &&
        !PyObject_IS_GC(topic) && !PyObject_IS_GC(attrs) && !PyObject_IS_GC(payload))
        PyObject_GC_UnTrack(rec);
    if (pend == Py_None) {
        Py_DECREF(pend);
        pend = PyList_New(0);
        if (pend == NULL || PyObject_SetAttr(dev, s_pend, pend))
            goto error;
        tmp = PyObject_GetAttr(store, s__pend_devs);
        if (tmp == NULL || PyList_Append(tmp, dev))
            goto error;
        Py_CLEAR(tmp);
    }
    if (PyList_Append(pend, rec) || incr_attr(store, s__pend_n, 1))
        goto error;
    long long tl = PyUnicode_GET_LENGTH(topic);
    long long size = HEADER_SIZE + PyBytes_GET_SIZE(kb) + tl + PyBytes_GET_SIZE(payload) +
                     hsize;
    if (incr_attr(store, s__pend_bound, size + 3 * tl))
        goto error;
    tmp = PyObject_GetAttr(store, s__cache_on);
    if (tmp == NULL)
        goto error;
    int on = PyObject_IsTrue(tmp);
    Py_CLEAR(tmp);
    if (on < 0)
        goto error;
    if (on) {
        tmp = PyObject_GetAttr(dev, s_cache);
        if (tmp == NULL || PyList_Append(tmp, rec) || incr_attr(dev, s_cache_bytes, size) ||
            incr_attr(store, s__cache_total, size))
            goto error;
        Py_CLEAR(tmp);
    }
    result = Py_NewRef(next);
    goto error; /* common cleanup */
done:
    if (defer) {
        Py_XDECREF(tmp);
        Py_XDECREF(devices);
        Py_XDECREF(dev);
        Py_XDECREF(next);
        Py_XDECREF(kb);
        Py_XDECREF(pend);
        return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
    }
error:
    Py_XDECREF(tmp);
    Py_XDECREF(devices);
    Py_XDECREF(dev);
    Py_XDECREF(next);
    Py_XDECREF(kb);
    Py_XDECREF(pend);
    Py_XDECREF(rec);
    return result;
}

/* A builtin function whose vectorcall passes its ``self`` (the fallback) to c_append. */
typedef struct {
    PyObject_HEAD
    PyObject *fallback;
    vectorcallfunc vectorcall;
} Appender;

static PyObject *appender_call(PyObject *o, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    return c_append(((Appender *)o)->fallback, args, nargsf, kwnames);
}

static void appender_dealloc(PyObject *o)
{
    PyObject_GC_UnTrack(o);
    Py_CLEAR(((Appender *)o)->fallback);
    Py_TYPE(o)->tp_free(o);
}

static int appender_traverse(PyObject *o, visitproc visit, void *arg)
{
    Py_VISIT(((Appender *)o)->fallback);
    return 0;
}

/* Binds like a function (LogStore.append is an attribute of the class). */
static PyObject *appender_get(PyObject *o, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(o);
    return PyMethod_New(o, obj);
}

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commitlog._speedups.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_dealloc = appender_dealloc,
    .tp_vectorcall_offset = offsetof(Appender, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = appender_get,
    /* METHOD_DESCRIPTOR: ``store.append(...)`` calls it with the store prepended, without
     * building a bound method per call (as for a Python function). */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = appender_traverse,
    .tp_doc = "LogStore.append for the plain case; everything else goes to the Python method.",
};

/* make_append(fallback) -> a callable that binds like a function, for LogStore.append. */
static PyObject *py_make_append(PyObject *self, PyObject *fallback)
{
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "make_append(fallback: callable)");
        return NULL;
    }
    Appender *a = PyObject_GC_New(Appender, &AppenderType);
    if (a == NULL)
        return NULL;
    a->fallback = Py_NewRef(fallback);
    a->vectorcall = appender_call;
    PyObject_GC_Track(a);
    return (PyObject *)a;
}

/* ------------------------------------------------------------------ read planning */

/* coalesce(plist: array('q'), k, kend, s, e, rel_limit, chunk) -> (k, e)
 *
 * The coalescing loop of LogStore._read_positions: extends the read [s, e) over the
 * position entries plist[k:kend] while each starts where the previous ended, stays
 * within ``rel_limit`` (committed) and the read stays within ``chunk`` bytes. */
static PyObject *py_coalesce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "coalesce takes 7 arguments");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    Py_ssize_t kend = PyLong_AsSsize_t(args[2]);
    long long s = PyLong_AsLongLong(args[3]);
    long long e = PyLong_AsLongLong(args[4]);
    long long rel_limit = PyLong_AsLongLong(args[5]);
    long long chunk = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT) < 0)
        return NULL;
    if (view.itemsize != 8 || view.format == NULL || strcmp(view.format, "q") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "coalesce needs an array('q')");
        return NULL;
    }
    const int64_t *pl = view.buf;
    Py_ssize_t n = view.len / 8;
    if (kend > n)
        kend = n;
    while (k >= 0 && k < kend) {
        int64_t v = pl[k];
        if ((v >> 32) != e)
            break;
        long long e2 = e + (v & 0xFFFFFFFF);
        if (e2 > rel_limit || e2 - s > chunk)
            break;
        e = e2;
        k++;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nL)", k, e);
}

/* ------------------------------------------------------------------ trim_count */

/* trim_count(cache, klen, excess) -> (k, freed): the fewest cached records, from the front,
   whose charged sizes (store._cache_size) add up to at least ``excess`` bytes, or all of
   them. LogStore.commit trims every device's tail cache after each fsync; in Python this
   loop was ~5% of a QoS 1 publish's CPU (one function call per record). */
static PyObject *py_trim_count(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "trim_count(list, klen, excess)");
        return NULL;
    }
    PyObject *cache = args[0];
    Py_ssize_t klen = PyLong_AsSsize_t(args[1]);
    long long excess = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t k = 0, n = PyList_GET_SIZE(cache);
    long long freed = 0;
    while (k < n && freed < excess) {
        PyObject *r = PyList_GET_ITEM(cache, k);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 7) {
            PyErr_SetString(PyExc_TypeError, "trim_count: cached records must be Records");
            return NULL;
        }
        Py_ssize_t tl = PyObject_Length(PyTuple_GET_ITEM(r, 3));
        Py_ssize_t pl = PyObject_Length(PyTuple_GET_ITEM(r, 6));
        if (tl < 0 || pl < 0)
            return NULL;
        long long size = HEADER_SIZE + klen + tl + pl;
        PyObject *hdrs = PyTuple_GET_ITEM(r, 5);
        int truth = PyObject_IsTrue(hdrs);
        if (truth < 0)
            return NULL;
        if (truth) {  /* record.headers_size: 6 + 4 * len(name) + len(value) each */
            PyObject *it = PyObject_GetIter(hdrs), *h;
            if (it == NULL)
                return NULL;
            while ((h = PyIter_Next(it)) != NULL) {
                PyObject *name = NULL, *value = NULL;
                Py_ssize_t nl = -1, vl = -1;
                if (PySequence_Check(h) && PySequence_Size(h) == 2) {
                    name = PySequence_GetItem(h, 0);
                    value = name ? PySequence_GetItem(h, 1) : NULL;
                    nl = name ? PyObject_Length(name) : -1;
                    vl = value ? PyObject_Length(value) : -1;
                } else if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "trim_count: a header is not a pair");
                }
                Py_XDECREF(name);
                Py_XDECREF(value);
                Py_DECREF(h);
                if (nl < 0 || vl < 0) {
                    Py_DECREF(it);
                    return NULL;
                }
                size += 6 + 4 * (long long)nl + vl;
            }
            Py_DECREF(it);
            if (PyErr_Occurred())
                return NULL;
        }
        freed += size;
        k++;
    }
    return Py_BuildValue("nL", k, freed);
}

/* ------------------------------------------------------------------ raw device reads */

/* raw_run(data: bytes, p, kb: bytes, want, upto, used, max_bytes) -> (p, want, used, done)
 *
 * The loop of LogStore._raw_positions (the fetch path that sends stored bytes): checks the
 * records of ``data`` from ``p`` as read_run does (framing, this device's key, no control
 * record, offset == want, the byte cap, CRC, key and topic inside the record) WITHOUT
 * decoding them: the caller sends data[start:p] as it is. done=True once ``upto`` or
 * ``max_bytes`` is reached (after the record that reached it, or before a record the cap
 * refuses); otherwise it stopped at a record the Python loop must look at. */
static PyObject *py_raw_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "raw_run(bytes, p, kb: bytes, want, upto, used, max_bytes)");
        return NULL;
    }
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    long long want = PyLong_AsLongLong(args[3]);
    long long upto = PyLong_AsLongLong(args[4]);
    long long used = PyLong_AsLongLong(args[5]);
    long long max_bytes = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t dn = PyBytes_GET_SIZE(args[0]);
    const char *kb = PyBytes_AS_STRING(args[2]);
    Py_ssize_t klen = PyBytes_GET_SIZE(args[2]);
    int done = want >= upto;
    while (!done && p >= 0 && p < dn) {
        if (dn - p < HEADER_SIZE)
            break;
        Hdr h;
        unpack_header(b + p, &h);
        Py_ssize_t rend;
        int framed = frame_ok(&h, p, dn, &rend);
        Py_ssize_t q = p + HEADER_SIZE;
        if (!framed || (Py_ssize_t)h.kl != klen || (h.flags & FLAG_CONTROL) ||
            (Py_ssize_t)h.kl + (Py_ssize_t)h.tl > rend - q ||
            memcmp(b + q, kb, (size_t)klen) != 0 || h.off != want)
            break;
        long long rlen = (long long)h.len_u + 4;
        if (used && used + rlen > max_bytes) {
            done = 1;
            break;
        }
        if (crc(b + p + 8, rend - p - 8) != h.crc)
            break;
        used += rlen;
        want += 1;
        p = rend;
        if (want >= upto || used >= max_bytes)
            done = 1;
    }
    return Py_BuildValue("(nLLO)", p, want, used, done ? Py_True : Py_False);
}

/* ------------------------------------------------------------------ Arrow buffers */

/* True if b[0:n] is what the last check accepted, else checks it as Python's strict UTF-8
 * decode does (and remembers it). 0 valid, 1 invalid (hand back), -1 exception. */
static int utf8_check(const unsigned char **last, Py_ssize_t *last_n, const unsigned char *b,
                      Py_ssize_t n)
{
    if (*last != NULL && *last_n == n && memcmp(*last, b, (size_t)n) == 0)
        return 0;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)b, n, NULL);
    if (s == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    Py_DECREF(s);
    *last = b;
    *last_n = n;
    return 0;
}

/* arrow_run(buf, pos, end, verify) -> tuple | None
 *
 * All of fetch.decode_fetch_buffers over buf[pos:end] in C, or nothing: the Arrow buffers
 * (count, key offsets/data, offsets, timestamps, topic offsets/data, qos, retain bitmap,
 * payload offsets/data; offsets int32 from 0, little-endian, as Arrow lays them out), or
 * None when any record needs the Python loop (which then decodes the whole range and
 * raises the reference error). Two passes: check and size, then fill exact-size bytes. */
static PyObject *py_arrow_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "arrow_run(buf, pos, end, verify)");
        return NULL;
    }
    Py_ssize_t pos0 = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    int verify = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || verify < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer_ro(args[0], &view))
        return NULL;
    const unsigned char *b = view.buf;
    if (end > view.len)
        end = view.len;
    PyObject *result = NULL;
    PyObject *o[11] = {NULL};
    Py_ssize_t n = 0, kbytes = 0, tbytes = 0, pbytes = 0;
    const unsigned char *lk = NULL, *lt = NULL, *lh = NULL;
    Py_ssize_t lkn = 0, ltn = 0, lhn = 0;
    int rc;
    /* pass 1: check every record, count, size the columns */
    Py_ssize_t pos = pos0;
    while (pos < end) {
        if (pos < 0 || end - pos < HEADER_SIZE)
            goto hand_back;
        Hdr h;
        unpack_header(b + pos, &h);
        Py_ssize_t rend;
        if (!frame_ok(&h, pos, end, &rend))
            goto hand_back;
        if (verify && crc(b + pos + 8, rend - pos - 8) != h.crc)
            goto hand_back;
        if (h.flags & FLAG_CONTROL) {
            pos = rend;
            continue;
        }
        Py_ssize_t q = pos + HEADER_SIZE;
        if ((Py_ssize_t)h.kl + (Py_ssize_t)h.tl > rend - q)
            goto hand_back;
        if ((rc = utf8_check(&lk, &lkn, b + q, h.kl)) != 0)
            goto rc_out;
        q += h.kl;
        if ((rc = utf8_check(&lt, &ltn, b + q, h.tl)) != 0)
            goto rc_out;
        q += h.tl;
        for (unsigned i = 0; i < h.hc; i++) { /* headers: bounds and names, as Python */
            if (q + 6 > rend)
                goto hand_back;
            Py_ssize_t nl = rd16(b + q), vl = rd32(b + q + 2);
            q += 6;
            if (nl > rend - q || vl > rend - q - nl)
                goto hand_back;
            if ((rc = utf8_check(&lh, &lhn, b + q, nl)) != 0)
                goto rc_out;
            q += nl + vl;
        }
        if (q > rend)
            goto hand_back;
        n++;
        kbytes += h.kl;
        tbytes += h.tl;
        pbytes += rend - q;
        pos = rend;
    }
    if (kbytes > INT32_MAX || tbytes > INT32_MAX || pbytes > INT32_MAX)
        goto hand_back;
    /* pass 2: fill */
    Py_ssize_t sizes[11] = {0, 4 * (n + 1), kbytes, 8 * n, 8 * n, 4 * (n + 1), tbytes, 4 * n,
                            (n + 7) / 8, 4 * (n + 1), pbytes};
    o[0] = PyLong_FromSsize_t(n);
    if (o[0] == NULL)
        goto done;
    for (int c = 1; c < 11; c++) {
        o[c] = PyBytes_FromStringAndSize(NULL, sizes[c]);
        if (o[c] == NULL)
            goto done;
    }
    unsigned char *ko = (unsigned char *)PyBytes_AS_STRING(o[1]);
    unsigned char *kd = (unsigned char *)PyBytes_AS_STRING(o[2]);
    unsigned char *oo = (unsigned char *)PyBytes_AS_STRING(o[3]);
    unsigned char *to = (unsigned char *)PyBytes_AS_STRING(o[4]);
    unsigned char *tpo = (unsigned char *)PyBytes_AS_STRING(o[5]);
    unsigned char *tpd = (unsigned char *)PyBytes_AS_STRING(o[6]);
    unsigned char *qo = (unsigned char *)PyBytes_AS_STRING(o[7]);
    unsigned char *ro = (unsigned char *)PyBytes_AS_STRING(o[8]);
    unsigned char *po = (unsigned char *)PyBytes_AS_STRING(o[9]);
    unsigned char *pd = (unsigned char *)PyBytes_AS_STRING(o[10]);
    memset(ro, 0, (size_t)sizes[8]);
    uint32_t kacc = 0, tacc = 0, pacc = 0;
    wr32(ko, 0);
    wr32(tpo, 0);
    wr32(po, 0);
    Py_ssize_t i = 0;
    pos = pos0;
    while (pos < end) {
        Hdr h;
        unpack_header(b + pos, &h);
        Py_ssize_t rend = pos + 4 + (Py_ssize_t)h.len_u;
        if (h.flags & FLAG_CONTROL) {
            pos = rend;
            continue;
        }
        Py_ssize_t q = pos + HEADER_SIZE;
        memcpy(kd + kacc, b + q, h.kl);
        kacc += h.kl;
        q += h.kl;
        memcpy(tpd + tacc, b + q, h.tl);
        tacc += h.tl;
        q += h.tl;
        for (unsigned j = 0; j < h.hc; j++)
            q += 6 + (Py_ssize_t)rd16(b + q) + (Py_ssize_t)rd32(b + q + 2);
        memcpy(pd + pacc, b + q, (size_t)(rend - q));
        pacc += (uint32_t)(rend - q);
        wr64(oo + 8 * i, h.off);
        wr64(to + 8 * i, h.ts);
        wr32(qo + 4 * i, h.attrs & 0x03);
        if (h.attrs & 0x04)
            ro[i >> 3] |= (unsigned char)(1u << (i & 7));
        i++;
        wr32(ko + 4 * i, kacc);
        wr32(tpo + 4 * i, tacc);
        wr32(po + 4 * i, pacc);
        pos = rend;
    }
    result = PyTuple_New(11);
    if (result != NULL) {
        for (int c = 0; c < 11; c++) {
            PyTuple_SET_ITEM(result, c, o[c]);
            o[c] = NULL;
        }
    }
    goto done;
rc_out:
    if (rc < 0)
        goto done;
hand_back:
    result = Py_NewRef(Py_None);
done:
    for (int c = 0; c < 11; c++)
        Py_XDECREF(o[c]);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ crc */

static PyObject *py_crc32(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (get_buffer_ro(arg, &view))
        return NULL;
    uint32_t c = crc(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)py_setup, METH_O, "setup(Record): the record class to build."},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL,
     "Inner loop of LogStore.flush for one device (see the C source)."},
    {"decode_run", (PyCFunction)(void (*)(void))py_decode_run, METH_FASTCALL,
     "Loop of record.decode_batch (see the C source)."},
    {"read_run", (PyCFunction)(void (*)(void))py_read_run, METH_FASTCALL,
     "Inner loop of LogStore._read_positions (see the C source)."},
    {"scan_run", (PyCFunction)(void (*)(void))py_scan_run, METH_FASTCALL,
     "Loop of LogStore._scan_tail (see the C source)."},
    {"walk_run", (PyCFunction)(void (*)(void))py_walk_run, METH_FASTCALL,
     "Loop of store.walk_positions (see the C source)."},
    {"columns_run", (PyCFunction)(void (*)(void))py_columns_run, METH_FASTCALL,
     "Loop of fetch.decode_fetch_columns (see the C source)."},
    {"make_append", (PyCFunction)py_make_append, METH_O,
     "make_append(python_append) -> LogStore.append with a C plain path."},
    {"coalesce", (PyCFunction)(void (*)(void))py_coalesce, METH_FASTCALL,
     "Coalescing loop of LogStore._read_positions (see the C source)."},
    {"trim_count", (PyCFunction)(void (*)(void))py_trim_count, METH_FASTCALL,
     "Loop of LogStore._trim_cache_front (see the C source)."},
    {"raw_run", (PyCFunction)(void (*)(void))py_raw_run, METH_FASTCALL,
     "Loop of LogStore._raw_positions: check stored records without decoding them."},
    {"arrow_run", (PyCFunction)(void (*)(void))py_arrow_run, METH_FASTCALL,
     "fetch.decode_fetch_buffers in one C call, or None (see the C source)."},
    {"crc32", (PyCFunction)py_crc32, METH_O, "zlib.crc32 of a buffer (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "commitlog._speedups",
    "Optional compiled loops of the commit log (pure-Python fallback: COMMITLOG_PURE_PYTHON=1).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    EmptyTuple = PyTuple_New(0);
    One = PyLong_FromLong(1);
    if (EmptyTuple == NULL || One == NULL)
        return NULL;
#define INTERN(var, s)                                                                  \
    if ((var = PyUnicode_InternFromString(s)) == NULL)                                  \
        return NULL;
    INTERN(s_since_idx, "since_idx");
    INTERN(s_total, "total");
    INTERN(s_max_ts, "max_ts");
    INTERN(s_next, "next");
    INTERN(s_durable_end, "durable_end");
    INTERN(s_seg_base, "seg_base");
    INTERN(s_apos_base, "apos_base");
    INTERN(s_apos, "apos");
    INTERN(s_frombytes, "frombytes");
    INTERN(s_kb, "kb");
    INTERN(s_pend, "pend");
    INTERN(s_cache, "cache");
    INTERN(s_cache_bytes, "cache_bytes");
    INTERN(s__broken, "_broken");
    INTERN(s__devices, "_devices");
    INTERN(s__pend_devs, "_pend_devs");
    INTERN(s__pend_n, "_pend_n");
    INTERN(s__pend_bound, "_pend_bound");
    INTERN(s__cache_on, "_cache_on");
    INTERN(s__cache_total, "_cache_total");
#undef INTERN
    if (PyType_Ready(&AppenderType) < 0)
        return NULL;
    return PyModule_Create(&moduledef);
}
