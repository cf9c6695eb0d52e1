/* Optional compiled fast path of the mesh link's entry codec (cluster/frames.py).

   A message that crosses a link is encoded into an entry body by the router that routed it and
   decoded from an ENTRIES frame by the router that delivers it. In Python each side took a
   dozen calls per entry (struct packs and unpacks, str encode/decode, a slice per field, the
   Entry object): about 2.2 us of the ~11 us a crossing cost (issue 25). This file does the
   plain case of both in C, as broker/protocol/_speedups.c does for the MQTT parse loop:

   - decode_run() is the plain case of frames._decode_entries' loop: entries without MQTT 5
     properties. It stops, without consuming it, at the first entry that is anything else:
     properties (decoded by broker/protocol/properties.py), a field running past the frame,
     text that is not UTF-8. frames._decode_entries then decodes the rest in Python, which
     stays the reference and raises every FrameError. So this code never raises a protocol
     error itself and only ever produces what the Python loop would have produced
     (tests/cluster/test_frames_speedups.py checks that, entry by entry, on generated
     frames, malformed ones included).
   - entry_body() is frames.entry_body for a message without properties (the caller checks):
     the same bytes, one call.
   - decode_plain() is the receiving router's shortcut for the commonest entry, a plain
     DELIVER (an unlogged publish without properties or expiry): straight to the broker
     Message that Mesh.on_entries would build from its Entry, for a leading run of fresh
     ones; the rest of the frame goes to frames._decode_entries as before
     (tests/cluster/test_cross_plain.py checks it against the Python path).
   - encode_run() is cluster/sendrun.py encode_run: a run of plain DELIVERs queued on one
     link, heads and bodies in one bytes object (the same bytes; test_cross_run.py).
   - entry_items() is cluster/sendrun.py entry_items: a publisher's run of plain QoS 0
     payloads on one topic as the flat items a link's Run holds, in one call (it was one
     entry_body call and a Python step per entry on every crossing).
   - plain_run_end() is cluster/sendrun.py plain_run_end: where the run of plain QoS 0
     messages on one topic from one origin that starts at i ends, in the messages
     decode_plain made (the receiving router routes such a run as one).

   CLUSTER_PURE_PYTHON=1, or a failed build, runs the Python code only. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>

#define F_RETAIN 0x04
#define F_PROPS 0x08
#define F_ORIGIN 0x10
#define F_DEVICE 0x20
#define F_EXPIRY 0x40
#define F_GROUP 0x80
#define KIND_APPEND 1

static PyTypeObject *EntryType = NULL;

/* setup(Entry): the entry class decode_run builds (a NamedTuple of 13 fields). */
static PyObject *py_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyType_Check(args[0])
            || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup(Entry): a tuple subclass");
        return NULL;
    }
    Py_XSETREF(EntryType, (PyTypeObject *)Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

static inline unsigned long long be64(const unsigned char *p)
{
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline unsigned long be32(const unsigned char *p)
{
    return ((unsigned long)p[0] << 24) | ((unsigned long)p[1] << 16)
        | ((unsigned long)p[2] << 8) | p[3];
}

/* A u16-prefixed UTF-8 string at *p (bounds-checked against n). Returns a new reference, or
   NULL with no exception set when it does not fit or is not UTF-8 (Python then decodes the
   entry and raises), or NULL with an exception set on a real error (memory). ``last`` caches
   the previous string read at this field: one router's entries repeat the same origin and
   device names. */
typedef struct { const unsigned char *b; Py_ssize_t n; PyObject *s; } Cached;

static PyObject *read_text(const unsigned char *d, Py_ssize_t n, Py_ssize_t *p,
                           Py_ssize_t len, Cached *last)
{
    Py_ssize_t at = *p;
    if (len < 0) {
        if (at + 2 > n)
            return NULL;
        len = ((Py_ssize_t)d[at] << 8) | d[at + 1];
        at += 2;
    }
    if (at + len > n)
        return NULL;
    const unsigned char *b = d + at;
    PyObject *s;
    if (last->s != NULL && last->n == len && memcmp(last->b, b, len) == 0) {
        s = Py_NewRef(last->s);
    } else {
        s = PyUnicode_DecodeUTF8((const char *)b, len, NULL);
        if (s == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                PyErr_Clear();
            return NULL;
        }
        Py_XSETREF(last->s, Py_NewRef(s));
        last->b = b;
        last->n = len;
    }
    *p = at + len;
    return s;
}

/* decode_run(body: bytes, pos: int, count: int, epochs: int, out: list) -> int

   Appends up to ``count`` plain entries starting at ``pos`` to ``out`` as Entry tuples and
   returns the position of the first byte it did not consume. ``epochs``: 0 no epoch in any
   head (version 2), 1 in an APPEND's head (version 3), 2 in every head (version 4). */
static PyObject *py_decode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "decode_run(bytes, pos, count, epochs, list)");
        return NULL;
    }
    if (EntryType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_run: setup() was not called");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    long epochs = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (pos < 0)
        pos = n;
    PyObject *out = args[4];
    Cached topics = {NULL, 0, NULL}, origins = {NULL, 0, NULL}, devices = {NULL, 0, NULL};
    PyObject *fields[13];
    int failed = 0;

    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t p = pos;
        if (p + 12 > n)
            break;
        unsigned long long seq = be64(d + p);
        unsigned kind = d[p + 8], flags = d[p + 9];
        Py_ssize_t tlen = ((Py_ssize_t)d[p + 10] << 8) | d[p + 11];
        p += 12;
        long long epoch = -1;
        if (epochs == 2 || (epochs == 1 && kind == KIND_APPEND)) {
            if (p + 4 > n)
                break;
            epoch = (long long)be32(d + p);
            p += 4;
        }
        if (flags & F_PROPS)
            break;  /* MQTT 5 properties: the Python decoder */
        memset(fields, 0, sizeof(fields));
        fields[2] = read_text(d, n, &p, tlen, &topics);
        if (fields[2] == NULL)
            goto stop;
        if (p + 4 > n)
            goto stop;
        Py_ssize_t plen = (Py_ssize_t)be32(d + p);
        p += 4;
        if (p + plen > n)
            goto stop;
        fields[3] = PyBytes_FromStringAndSize((const char *)d + p, plen);
        if (fields[3] == NULL)
            goto stop;
        p += plen;
        if (flags & F_ORIGIN) {
            fields[7] = read_text(d, n, &p, -1, &origins);
            if (fields[7] == NULL)
                goto stop;
        }
        long long offset = -1;
        if (flags & F_DEVICE) {
            fields[8] = read_text(d, n, &p, -1, &devices);
            if (fields[8] == NULL || p + 8 > n)
                goto stop;
            offset = (long long)be64(d + p);
            p += 8;
        }
        if (flags & F_EXPIRY) {
            if (p + 4 > n)
                goto stop;
            fields[10] = PyLong_FromUnsignedLong(be32(d + p));
            if (fields[10] == NULL)
                goto stop;
            p += 4;
        }
        if (flags & F_GROUP) {
            Cached none1 = {NULL, 0, NULL}, none2 = {NULL, 0, NULL};
            PyObject *name = read_text(d, n, &p, -1, &none1);
            Py_XDECREF(none1.s);
            if (name == NULL)
                goto stop;
            PyObject *flt = read_text(d, n, &p, -1, &none2);
            Py_XDECREF(none2.s);
            if (flt == NULL) {
                Py_DECREF(name);
                goto stop;
            }
            fields[11] = PyTuple_Pack(2, name, flt);
            Py_DECREF(name);
            Py_DECREF(flt);
            if (fields[11] == NULL)
                goto stop;
        }
        fields[0] = PyLong_FromUnsignedLongLong(seq);
        fields[1] = PyLong_FromLong(kind);
        fields[4] = PyLong_FromLong(flags & 0x03);
        fields[5] = Py_NewRef((flags & F_RETAIN) ? Py_True : Py_False);
        fields[6] = Py_NewRef(Py_None);
        if (fields[7] == NULL)
            fields[7] = Py_NewRef(Py_None);
        if (fields[8] == NULL)
            fields[8] = Py_NewRef(Py_None);
        fields[9] = PyLong_FromLongLong(offset);
        if (fields[10] == NULL)
            fields[10] = Py_NewRef(Py_None);
        if (fields[11] == NULL)
            fields[11] = Py_NewRef(Py_None);
        fields[12] = PyLong_FromLongLong(epoch);
        if (!fields[0] || !fields[1] || !fields[4] || !fields[9] || !fields[12])
            goto stop;
        /* a NamedTuple instance without its Python __new__: a tuple of the subclass */
        PyObject *entry = EntryType->tp_alloc(EntryType, 13);
        if (entry == NULL)
            goto stop;
        for (int i = 0; i < 13; i++)
            PyTuple_SET_ITEM(entry, i, fields[i]);  /* steals each */
        int appended = PyList_Append(out, entry);
        Py_DECREF(entry);
        if (appended < 0) {
            failed = 1;
            break;
        }
        pos = p;
        continue;
    stop:
        for (int i = 0; i < 13; i++)
            Py_XDECREF(fields[i]);
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            failed = 1;
        else
            PyErr_Clear();
        break;
    }
    Py_XDECREF(topics.s);
    Py_XDECREF(origins.s);
    Py_XDECREF(devices.s);
    if (failed)
        return NULL;
    return PyLong_FromSsize_t(pos);
}

/* The receiving router's plain DELIVER, straight to a broker Message (issue 25, "cheap
   crossings"): an unlogged QoS 0/1/2 publish without properties, expiry or group, which the
   receiver only routes to its local subscribers. Building the Entry tuple, then a Message from
   it in Python (its __init__: a frame and 14 attribute stores) was a third of the receiving
   side of a crossing. setup_message(Message, template) gives the class and an instance made by
   its own __init__: a new message starts as a copy of every slot of the template (so a slot
   added to Message later gets its __init__ default here too, not NULL), then gets the five
   fields an entry carries. */
static PyTypeObject *MessageType = NULL;
static PyObject *MessageTemplate = NULL;
#define MAX_SLOTS 64
static Py_ssize_t msg_offsets[MAX_SLOTS];
static int msg_nslots = 0;
static Py_ssize_t off_topic = -1, off_payload = -1, off_qos = -1, off_retain = -1,
    off_origin = -1;

static Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)cls, name);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "setup_message: %R is not a slot", name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    Py_ssize_t off = (m->type == T_OBJECT_EX || m->type == T_OBJECT) ? m->offset : -1;
    Py_DECREF(descr);
    if (off < 0)
        PyErr_Format(PyExc_TypeError, "setup_message: %R is not an object slot", name);
    return off;
}

/* setup_message(Message, template): see above. Message must define __slots__ only (no
   __dict__: a plain class would need its dict built). */
static PyObject *py_setup_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0])
            || !PyObject_TypeCheck(args[1], (PyTypeObject *)args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_message(Message, an instance of it)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (cls->tp_dictoffset != 0 || cls->tp_base != &PyBaseObject_Type) {
        PyErr_SetString(PyExc_TypeError, "setup_message: a class of __slots__ only");
        return NULL;
    }
    PyObject *slots = PyObject_GetAttrString((PyObject *)cls, "__slots__");
    if (slots == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(slots, "setup_message: __slots__ is not a sequence");
    Py_DECREF(slots);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_SLOTS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "setup_message: too many slots");
        return NULL;
    }
    int count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t off = slot_offset(cls, PySequence_Fast_GET_ITEM(seq, i));
        if (off < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        msg_offsets[count++] = off;
    }
    Py_DECREF(seq);
    const char *names[5] = {"topic", "payload", "qos", "retain", "origin"};
    Py_ssize_t *offs[5] = {&off_topic, &off_payload, &off_qos, &off_retain, &off_origin};
    for (int i = 0; i < 5; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL)
            return NULL;
        *offs[i] = slot_offset(cls, name);
        Py_DECREF(name);
        if (*offs[i] < 0)
            return NULL;
    }
    /* every slot of the template must be set (its __init__ ran) */
    for (int i = 0; i < count; i++) {
        if (*(PyObject **)((char *)args[1] + msg_offsets[i]) == NULL) {
            PyErr_SetString(PyExc_ValueError, "setup_message: the template has an unset slot");
            return NULL;
        }
    }
    msg_nslots = count;
    Py_XSETREF(MessageType, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(MessageTemplate, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject **at = (PyObject **)((char *)obj + off);
    Py_XSETREF(*at, value);  /* steals value */
}

/* decode_plain(body: bytes, pos: int, count: int, epochs: int, received: int, out: list)
       -> (pos, received)

   Appends to ``out`` a Message for each entry, from ``pos``, that is a plain DELIVER (kind
   DELIVER; no properties, device, expiry or group) with a seq above ``received`` (and above
   the one before it): what Mesh.on_entries routes inline. Stops, without consuming it, at the
   first entry that is anything else (a resent seq, an APPEND, a logged DELIVER, a field past
   the frame, text that is not UTF-8), after ``count`` entries, or at the end; returns where
   it stopped and the last seq it took. The caller decodes whatever follows with
   frames.decode_entries_at, which raises every FrameError: this code raises none. */
static PyObject *py_decode_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_plain(bytes, pos, count, epochs, received, list)");
        return NULL;
    }
    if (MessageType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_plain: setup_message() was not called");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    long epochs = PyLong_AsLong(args[3]);
    unsigned long long received = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (pos < 0)
        pos = n;
    PyObject *out = args[5];
    Cached topics = {NULL, 0, NULL}, origins = {NULL, 0, NULL};
    int failed = 0;
    const unsigned plain_mask = F_PROPS | F_DEVICE | F_EXPIRY | F_GROUP;

    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t p = pos;
        if (p + 12 > n)
            break;
        unsigned long long seq = be64(d + p);
        unsigned kind = d[p + 8], flags = d[p + 9];
        Py_ssize_t tlen = ((Py_ssize_t)d[p + 10] << 8) | d[p + 11];
        if (kind != 0 /* DELIVER */ || (flags & plain_mask) || seq <= received)
            break;
        p += 12;
        if (epochs == 2) {  /* version 4: every head has one; a plain DELIVER's is not used */
            if (p + 4 > n)
                break;
            p += 4;
        }
        PyObject *topic = read_text(d, n, &p, tlen, &topics);
        if (topic == NULL) {
            if (PyErr_Occurred())
                failed = 1;
            break;
        }
        if (p + 4 > n) {
            Py_DECREF(topic);
            break;
        }
        Py_ssize_t plen = (Py_ssize_t)be32(d + p);
        p += 4;
        if (p + plen > n) {
            Py_DECREF(topic);
            break;
        }
        const unsigned char *payload_at = d + p;
        p += plen;
        PyObject *origin = NULL;
        if (flags & F_ORIGIN) {
            origin = read_text(d, n, &p, -1, &origins);
            if (origin == NULL) {
                Py_DECREF(topic);
                if (PyErr_Occurred())
                    failed = 1;
                break;
            }
        }
        PyObject *payload = PyBytes_FromStringAndSize((const char *)payload_at, plen);
        PyObject *qos = PyLong_FromLong(flags & 0x03);
        PyObject *msg = (payload && qos) ? MessageType->tp_alloc(MessageType, 0) : NULL;
        if (msg == NULL) {
            Py_DECREF(topic);
            Py_XDECREF(origin);
            Py_XDECREF(payload);
            Py_XDECREF(qos);
            failed = 1;
            break;
        }
        for (int i = 0; i < msg_nslots; i++) {
            PyObject *v = *(PyObject **)((char *)MessageTemplate + msg_offsets[i]);
            *(PyObject **)((char *)msg + msg_offsets[i]) = Py_XNewRef(v);
        }
        set_slot(msg, off_topic, topic);
        set_slot(msg, off_payload, payload);
        set_slot(msg, off_qos, qos);
        set_slot(msg, off_retain, Py_NewRef((flags & F_RETAIN) ? Py_True : Py_False));
        set_slot(msg, off_origin, origin != NULL ? origin : Py_NewRef(Py_None));
        int appended = PyList_Append(out, msg);
        Py_DECREF(msg);
        if (appended < 0) {
            failed = 1;
            break;
        }
        received = seq;
        pos = p;
    }
    Py_XDECREF(topics.s);
    Py_XDECREF(origins.s);
    if (failed)
        return NULL;
    return Py_BuildValue("(nK)", pos, received);
}

/* Appends a u16-prefixed UTF-8 copy of ``s`` at *w (``raw``: its UTF-8 and length). */
static unsigned char *put_text(unsigned char *w, const char *raw, Py_ssize_t len)
{
    w[0] = (unsigned char)(len >> 8);
    w[1] = (unsigned char)len;
    memcpy(w + 2, raw, len);
    return w + 2 + len;
}

/* An entry body's start at w: the topic's UTF-8, then the payload with its u32 length (what
   entry_body and entry_items write first); returns where the rest goes. */
static unsigned char *put_topic_payload(unsigned char *w, const char *topic, Py_ssize_t tlen,
                                        const char *payload, Py_ssize_t plen)
{
    memcpy(w, topic, tlen);
    w += tlen;
    w[0] = (unsigned char)(plen >> 24);
    w[1] = (unsigned char)(plen >> 16);
    w[2] = (unsigned char)(plen >> 8);
    w[3] = (unsigned char)plen;
    memcpy(w + 4, payload, plen);
    return w + 4 + plen;
}

static int utf8_of(PyObject *s, const char **raw, Py_ssize_t *len, Py_ssize_t max)
{
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "entry_body: expected str");
        return -1;
    }
    *raw = PyUnicode_AsUTF8AndSize(s, len);
    if (*raw == NULL)
        return -1;
    if (*len > max) {  /* struct.pack(">H") raises struct.error in Python: do the same */
        PyErr_SetString(PyExc_OverflowError, "entry_body: string longer than 65535 bytes");
        return -1;
    }
    return 0;
}

/* entry_body(topic, payload, qos, retain, origin, device, offset, expiry, group)
       -> ((flags, topic length), body), or None when the payload is not bytes

   frames.entry_body for a message without properties (the caller checks), the same bytes. */
static PyObject *py_entry_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "entry_body(topic, payload, qos, retain, origin, "
                        "device, offset, expiry, group)");
        return NULL;
    }
    if (!PyUnicode_Check(args[0]) || !PyBytes_Check(args[1]))
        Py_RETURN_NONE;  /* a bytearray or memoryview payload: frames.entry_body does it */
    const char *topic, *origin = NULL, *device = NULL, *gname = NULL, *gflt = NULL;
    Py_ssize_t tlen, olen = 0, dlen = 0, glen1 = 0, glen2 = 0;
    Py_ssize_t plen = PyBytes_GET_SIZE(args[1]);
    long qos = PyLong_AsLong(args[2]);
    int retain = PyObject_IsTrue(args[3]);
    if ((qos == -1 && PyErr_Occurred()) || retain < 0)
        return NULL;
    /* the topic length travels in the 16-bit head field */
    if (utf8_of(args[0], &topic, &tlen, 65535) < 0)
        return NULL;
    if (plen > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_OverflowError, "entry_body: payload over 4 GiB");
        return NULL;
    }
    unsigned flags = (unsigned)qos | (retain ? F_RETAIN : 0);
    Py_ssize_t size = tlen + 4 + plen;
    if (args[4] != Py_None) {
        if (utf8_of(args[4], &origin, &olen, 65535) < 0)
            return NULL;
        flags |= F_ORIGIN;
        size += 2 + olen;
    }
    long long offset = 0;
    if (args[5] != Py_None) {
        if (utf8_of(args[5], &device, &dlen, 65535) < 0)
            return NULL;
        offset = PyLong_AsLongLong(args[6]);
        if (offset == -1 && PyErr_Occurred())
            return NULL;
        flags |= F_DEVICE;
        size += 2 + dlen + 8;
    }
    unsigned long expiry = 0;
    if (args[7] != Py_None) {
        expiry = PyLong_AsUnsignedLong(args[7]);
        if (expiry == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (expiry > 0xFFFFFFFFUL) {
            PyErr_SetString(PyExc_OverflowError, "entry_body: expiry over 32 bits");
            return NULL;
        }
        flags |= F_EXPIRY;
        size += 4;
    }
    if (args[8] != Py_None) {
        if (!PyTuple_Check(args[8]) || PyTuple_GET_SIZE(args[8]) != 2) {
            PyErr_SetString(PyExc_TypeError, "entry_body: group is a (name, filter) tuple");
            return NULL;
        }
        if (utf8_of(PyTuple_GET_ITEM(args[8], 0), &gname, &glen1, 65535) < 0
                || utf8_of(PyTuple_GET_ITEM(args[8], 1), &gflt, &glen2, 65535) < 0)
            return NULL;
        flags |= F_GROUP;
        size += 4 + glen1 + glen2;
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, size);
    if (body == NULL)
        return NULL;
    unsigned char *w = put_topic_payload((unsigned char *)PyBytes_AS_STRING(body), topic, tlen,
                                         PyBytes_AS_STRING(args[1]), plen);
    if (origin != NULL)
        w = put_text(w, origin, olen);
    if (device != NULL) {
        w = put_text(w, device, dlen);
        unsigned long long u = (unsigned long long)offset;
        for (int i = 7; i >= 0; i--) {
            w[i] = (unsigned char)u;
            u >>= 8;
        }
        w += 8;
    }
    if (flags & F_EXPIRY) {
        w[0] = (unsigned char)(expiry >> 24);
        w[1] = (unsigned char)(expiry >> 16);
        w[2] = (unsigned char)(expiry >> 8);
        w[3] = (unsigned char)expiry;
        w += 4;
    }
    if (gname != NULL) {
        w = put_text(w, gname, glen1);
        w = put_text(w, gflt, glen2);
    }
    PyObject *res = Py_BuildValue("((In)N)", flags, tlen, body);
    return res;
}

/* encode_run(seq, kind, items: list, with_epoch: bool) -> bytes

   cluster/sendrun.py encode_run: a run of entries queued on one link, ``items`` flat
   ((flags, topic length), body, epoch) per entry, seqs from ``seq``: each head (u64 seq, u8
   kind, u8 flags, u16 topic length[, u32 epoch]) then its body, in one bytes object (the
   flush wrote two parts per entry and joined them). Any item of the wrong shape raises
   TypeError or OverflowError, as struct.pack would. */
static PyObject *py_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "encode_run(seq, kind, items: list, with_epoch)");
        return NULL;
    }
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[0]);
    long kind = PyLong_AsLong(args[1]);
    int with_epoch = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || with_epoch < 0)
        return NULL;
    if (kind < 0 || kind > 255) {
        PyErr_SetString(PyExc_OverflowError, "encode_run: kind out of range");
        return NULL;
    }
    PyObject *items = args[2];
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n % 3) {
        PyErr_SetString(PyExc_ValueError, "encode_run: items come in threes");
        return NULL;
    }
    Py_ssize_t head = with_epoch ? 16 : 12, total = 0;
    for (Py_ssize_t i = 0; i < n; i += 3) {
        PyObject *h = PyList_GET_ITEM(items, i), *b = PyList_GET_ITEM(items, i + 1);
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2 || !PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "encode_run: ((flags, topic length), bytes, "
                            "epoch) per entry");
            return NULL;
        }
        total += head + PyBytes_GET_SIZE(b);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i += 3, seq++) {
        PyObject *h = PyList_GET_ITEM(items, i), *b = PyList_GET_ITEM(items, i + 1);
        long flags = PyLong_AsLong(PyTuple_GET_ITEM(h, 0));
        long tlen = PyLong_AsLong(PyTuple_GET_ITEM(h, 1));
        if (PyErr_Occurred())
            goto fail;
        if (flags < 0 || flags > 255 || tlen < 0 || tlen > 65535) {
            PyErr_SetString(PyExc_OverflowError, "encode_run: flags or topic length out of "
                            "range");
            goto fail;
        }
        unsigned long long u = seq;
        for (int k = 7; k >= 0; k--) {
            w[k] = (unsigned char)u;
            u >>= 8;
        }
        w[8] = (unsigned char)kind;
        w[9] = (unsigned char)flags;
        w[10] = (unsigned char)(tlen >> 8);
        w[11] = (unsigned char)tlen;
        w += 12;
        if (with_epoch) {
            unsigned long epoch = PyLong_AsUnsignedLong(PyList_GET_ITEM(items, i + 2));
            if (epoch == (unsigned long)-1 && PyErr_Occurred())
                goto fail;
            if (epoch > 0xFFFFFFFFUL) {
                PyErr_SetString(PyExc_OverflowError, "encode_run: epoch over 32 bits");
                goto fail;
            }
            w[0] = (unsigned char)(epoch >> 24);
            w[1] = (unsigned char)(epoch >> 16);
            w[2] = (unsigned char)(epoch >> 8);
            w[3] = (unsigned char)epoch;
            w += 4;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(b);
        memcpy(w, PyBytes_AS_STRING(b), len);
        w += len;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* entry_items(topic, payloads: list, qos, origin, epoch) -> (items, body bytes), or None
   when a payload is not bytes

   cluster/sendrun.py entry_items: for each payload, ``(flags, topic length), body, epoch``
   (the body as entry_body makes it for a message of ``topic`` and ``origin`` with no
   retain, properties, device, expiry or group), flat, as MeshLink.deliver_run appends them
   to a Run; and the bodies' total length, which the link counts against its bound. One head
   tuple serves every entry: they all have the same flags and topic length. */
static PyObject *py_entry_items(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "entry_items(topic: str, payloads: list, qos, origin, epoch)");
        return NULL;
    }
    PyObject *payloads = args[1];
    const char *topic, *origin = NULL;
    Py_ssize_t tlen, olen = 0;
    /* (before the payloads are read: a qos that is not an int runs its __index__, which
       could change the list under the loops below) */
    long qos = PyLong_AsLong(args[2]);
    if (qos == -1 && PyErr_Occurred())
        return NULL;
    if (qos < 0 || qos > 2) {
        PyErr_SetString(PyExc_ValueError, "entry_items: qos is 0, 1 or 2");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(PyList_GET_ITEM(payloads, i)))
            Py_RETURN_NONE;  /* a bytearray or memoryview payload: frames.entry_body does it */
    }
    if (utf8_of(args[0], &topic, &tlen, 65535) < 0)
        return NULL;
    unsigned flags = (unsigned)qos;
    if (args[3] != Py_None) {
        if (utf8_of(args[3], &origin, &olen, 65535) < 0)
            return NULL;
        flags |= F_ORIGIN;
    }
    PyObject *epoch = args[4];
    if (!PyLong_Check(epoch)) {
        PyErr_SetString(PyExc_TypeError, "entry_items: epoch is an int");
        return NULL;
    }
    PyObject *head = Py_BuildValue("(In)", flags, tlen);
    PyObject *items = head ? PyList_New(3 * n) : NULL;
    if (items == NULL) {
        Py_XDECREF(head);
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        Py_ssize_t plen = PyBytes_GET_SIZE(payload);
        if (plen > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_OverflowError, "entry_items: payload over 4 GiB");
            goto fail;
        }
        Py_ssize_t size = tlen + 4 + plen + (origin != NULL ? 2 + olen : 0);
        PyObject *body = PyBytes_FromStringAndSize(NULL, size);
        if (body == NULL)
            goto fail;
        unsigned char *w = put_topic_payload((unsigned char *)PyBytes_AS_STRING(body), topic,
                                             tlen, PyBytes_AS_STRING(payload), plen);
        if (origin != NULL)
            put_text(w, origin, olen);
        PyList_SET_ITEM(items, 3 * i, Py_NewRef(head));
        PyList_SET_ITEM(items, 3 * i + 1, body);
        PyList_SET_ITEM(items, 3 * i + 2, Py_NewRef(epoch));
        total += size;
    }
    Py_DECREF(head);
    return Py_BuildValue("(Nn)", items, total);
fail:
    Py_DECREF(head);
    Py_DECREF(items);  /* (a list's unset items are NULL: freed safely) */
    return NULL;
}

/* plain_run_end(msgs: list, i) -> j

   cluster/sendrun.py plain_run_end: with msgs[i] a QoS 0 message that is not retained, the
   index after the last of the messages from i on that are too and have its topic and origin
   (i + 1 when msgs[i] is not one). Only messages of the class decode_plain builds are read
   here; any other object ends the run, as Python's comparison never would for these. */
static PyObject *py_plain_run_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "plain_run_end(msgs: list, i)");
        return NULL;
    }
    if (MessageType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "plain_run_end: setup_message() was not called");
        return NULL;
    }
    PyObject *msgs = args[0];
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "plain_run_end: i out of range");
        return NULL;
    }
#define SLOT(m, off) (*(PyObject **)((char *)(m) + (off)))
    PyObject *first = PyList_GET_ITEM(msgs, i);
    Py_ssize_t j = i + 1;
    if (!Py_IS_TYPE(first, MessageType))
        return PyLong_FromSsize_t(j);
    PyObject *topic = SLOT(first, off_topic), *origin = SLOT(first, off_origin);
    PyObject *qos = SLOT(first, off_qos), *retain = SLOT(first, off_retain);
    if (topic == NULL || origin == NULL || qos == NULL || retain == NULL)
        return PyLong_FromSsize_t(j);
    int t = PyObject_IsTrue(qos);
    int r = t ? 0 : PyObject_IsTrue(retain);
    if (t < 0 || r < 0)
        return NULL;
    if (t || r)
        return PyLong_FromSsize_t(j);
    for (; j < n; j++) {
        PyObject *m = PyList_GET_ITEM(msgs, j);
        if (!Py_IS_TYPE(m, MessageType))
            break;
        PyObject *mt = SLOT(m, off_topic), *mo = SLOT(m, off_origin);
        PyObject *mq = SLOT(m, off_qos), *mr = SLOT(m, off_retain);
        if (mt == NULL || mo == NULL || mq == NULL || mr == NULL)
            break;
        t = PyObject_IsTrue(mq);
        if (t != 0) {
            if (t < 0)
                return NULL;
            break;
        }
        r = PyObject_IsTrue(mr);
        if (r != 0) {
            if (r < 0)
                return NULL;
            break;
        }
        /* (decode_plain hands the same str object to repeated topics and origins: the
           identity test inside RichCompareBool answers almost every one) */
        int same = PyObject_RichCompareBool(mt, topic, Py_EQ);
        if (same == 1)
            same = PyObject_RichCompareBool(mo, origin, Py_EQ);
        if (same != 1) {
            if (same < 0)
                return NULL;
            break;
        }
    }
#undef SLOT
    return PyLong_FromSsize_t(j);
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))py_setup, METH_FASTCALL,
     "setup(Entry): the entry class to build."},
    {"decode_run", (PyCFunction)(void (*)(void))py_decode_run, METH_FASTCALL,
     "The plain-entry loop of frames._decode_entries (see the C source)."},
    {"setup_message", (PyCFunction)(void (*)(void))py_setup_message, METH_FASTCALL,
     "setup_message(Message, template): the class decode_plain builds."},
    {"decode_plain", (PyCFunction)(void (*)(void))py_decode_plain, METH_FASTCALL,
     "The plain DELIVERs of an ENTRIES frame as broker Messages (see the C source)."},
    {"encode_run", (PyCFunction)(void (*)(void))py_encode_run, METH_FASTCALL,
     "A run of entries queued on one link, encoded (cluster/sendrun.py)."},
    {"entry_body", (PyCFunction)(void (*)(void))py_entry_body, METH_FASTCALL,
     "frames.entry_body for a message without properties (see the C source)."},
    {"entry_items", (PyCFunction)(void (*)(void))py_entry_items, METH_FASTCALL,
     "A run of plain payloads on one topic as a link Run's items (cluster/sendrun.py)."},
    {"plain_run_end", (PyCFunction)(void (*)(void))py_plain_run_end, METH_FASTCALL,
     "Where a run of plain QoS 0 messages ends (cluster/sendrun.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cluster._speedups",
    "Compiled fast path of the mesh entry codec (optional; see cluster/frames.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
