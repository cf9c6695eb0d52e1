/* Optional compiled fast path of the MQTT codec (broker/protocol/codec.py).

   parse_run() is the plain case of PacketParser.feed's loop: a run of complete PUBLISH
   packets without properties and of 4-byte PUBACKs, which is what a device and a QoS 1
   subscriber send all day. In Python that loop was the largest single cost of a QoS 1
   publish (~13% of the broker's CPU in the bench's qos1 profile). It stops, without
   consuming it, at the first packet that is anything else: another type, v5 properties,
   a topic that needs the slow checks (empty, wildcards, NUL), a partial packet, or
   anything malformed. PacketParser.feed then handles that packet in Python, which stays
   the reference and raises every error, and calls parse_run again after it. So this code
   never raises a protocol error itself and can only ever produce what the Python loop
   would have produced (tests/protocol/test_codec_speedups.py checks that on generated
   streams). BROKER_PURE_PYTHON=1, or a failed build, runs the Python loop only.

   publish_run_end() is the scan of the router's runs (broker/publishrun.py run_end): where
   a run of plain publishes on one topic ends in the packets parse_run made. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *PublishCls = NULL, *PubAckCls = NULL;

/* Building a packet without running its class's __init__ (issue 25). Publish and PubAck are
   ``@dataclass(slots=True)`` classes: their generated __init__ only stores each argument in
   its slot, and running it was a Python frame per packet, two per logged QoS 1 message (its
   PUBLISH, its subscriber's PUBACK). When setup() can prove a class is exactly that (every
   dataclass field is a writable object slot of the class, no __post_init__, object's
   tp_new, no __init__ of a base), parse_run allocates the object and fills the slots itself:
   the same object the call would make, field for field (PubAck's defaulted fields are taken
   from an instance made by the class itself at setup). Otherwise it calls the class as
   before. The Python loop (BROKER_PURE_PYTHON=1) always calls the class. */
#define MAX_FIELDS 8
typedef struct {
    Py_ssize_t n;                    /* 0: call the class instead */
    Py_ssize_t offset[MAX_FIELDS];   /* slot offsets, in the order of the names given */
    PyObject *deflt[MAX_FIELDS];     /* values of the fields parse_run does not pass */
} SlotPlan;

static SlotPlan PublishPlan, PubAckPlan;

static void plan_clear(SlotPlan *plan)
{
    for (Py_ssize_t i = 0; i < plan->n; i++)
        Py_CLEAR(plan->deflt[i]);
    plan->n = 0;
}

/* Fill ``plan`` for ``cls`` and its fields ``names`` (all of them, in slot-filling order);
   ``tmpl``, an instance made by the class, gives the defaults. Leaves plan->n = 0 (the
   call path) when the class is anything but a plain slotted dataclass. Never raises. */
static void plan_for(SlotPlan *plan, PyObject *cls, const char *const *names, Py_ssize_t n,
                     PyObject *tmpl)
{
    plan_clear(plan);
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *fields = NULL, *post = NULL;
    if (n > MAX_FIELDS || tp->tp_new != PyBaseObject_Type.tp_new || tp->tp_base != &PyBaseObject_Type
            || tp->tp_alloc != PyType_GenericAlloc || tmpl == NULL)
        goto fail;
    fields = PyObject_GetAttrString(cls, "__dataclass_fields__");
    if (fields == NULL || !PyDict_Check(fields) || PyDict_GET_SIZE(fields) != n)
        goto fail;
    post = PyObject_GetAttrString(cls, "__post_init__");
    if (post != NULL)
        goto fail;
    PyErr_Clear();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *descr = PyDict_GetItemString(tp->tp_dict, names[i]);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
                || PyDict_GetItemString(fields, names[i]) == NULL)
            goto fail;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            goto fail;
        plan->offset[i] = m->offset;
        plan->deflt[i] = PyObject_GetAttrString(tmpl, names[i]);
        if (plan->deflt[i] == NULL) {
            for (Py_ssize_t k = 0; k < i; k++)
                Py_CLEAR(plan->deflt[k]);
            goto fail;
        }
    }
    plan->n = n;
    Py_DECREF(fields);
    return;
fail:
    Py_XDECREF(fields);
    Py_XDECREF(post);
    PyErr_Clear();
    plan->n = 0;
}

/* A new instance of ``cls`` with the plan's slots set to ``vals[0..given-1]`` then the
   defaults; NULL (an exception set) on failure. */
static PyObject *plan_make(SlotPlan *plan, PyObject *cls, PyObject *const *vals,
                           Py_ssize_t given)
{
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *obj = tp->tp_alloc(tp, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        PyObject *v = i < given ? vals[i] : plan->deflt[i];
        *(PyObject **)((char *)obj + plan->offset[i]) = Py_NewRef(v);
    }
    return obj;
}

static const char *const PublishFields[] = {
    "topic", "payload", "qos", "retain", "dup", "packet_id", "properties"};
static const char *const PubAckFields[] = {"packet_id", "reason_code", "properties"};

/* setup(Publish, PubAck): the packet classes parse_run builds. */
static PyObject *py_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup(Publish, PubAck)");
        return NULL;
    }
    Py_XSETREF(PublishCls, Py_NewRef(args[0]));
    Py_XSETREF(PubAckCls, Py_NewRef(args[1]));
    /* templates made by the classes themselves: where the defaults come from */
    PyObject *pub = PyObject_CallFunction(PublishCls, "s", "t");
    if (pub == NULL)
        PyErr_Clear();
    plan_for(&PublishPlan, PublishCls, PublishFields, 7, pub);
    Py_XDECREF(pub);
    PyObject *ack = PyObject_CallFunction(PubAckCls, "i", 1);
    if (ack == NULL)
        PyErr_Clear();
    plan_for(&PubAckPlan, PubAckCls, PubAckFields, 3, ack);
    Py_XDECREF(ack);
    Py_RETURN_NONE;
}

/* slots_ready() -> (bool, bool): whether parse_run fills Publish / PubAck slots itself (for
   tests: the plan must not silently fall back to the call on the classes we ship). */
static PyObject *py_slots_ready(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(OO)", PublishPlan.n ? Py_True : Py_False,
                         PubAckPlan.n ? Py_True : Py_False);
}

/* parse_run(data: bytes, pos: int, level: int, max_packet_size: int, out: list) -> int

   Appends the packets of the plain run starting at ``pos`` to ``out`` and returns the
   position of the first byte it did not consume. */
static PyObject *py_parse_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "parse_run(bytes, pos, level, max_packet_size, list)");
        return NULL;
    }
    if (PublishCls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "parse_run: setup() was not called");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long level = PyLong_AsLong(args[2]);
    Py_ssize_t maxsize = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (pos < 0)
        pos = n;  /* nothing to do: Python handles whatever this is */
    PyObject *out = args[4];
    /* Devices publish to the same topic again and again: reuse the str of the last one. */
    const unsigned char *last_tb = NULL;
    Py_ssize_t last_tl = 0;
    PyObject *last_topic = NULL;

    while (pos < n) {
        unsigned b0 = d[pos];
        if (pos + 1 >= n)
            break;
        Py_ssize_t rl = d[pos + 1], body;
        if (rl < 128) {
            body = pos + 2;
        } else {
            /* Remaining Length, at most 4 bytes; anything odd goes to Python. */
            rl &= 127;
            int shift = 7, ok = 0;
            Py_ssize_t i = pos + 2;
            while (i < n && shift < 28) {
                unsigned b = d[i++];
                rl |= (Py_ssize_t)(b & 127) << shift;
                if (b < 128) {
                    ok = b != 0 || level != 5;  /* v5 wants the minimal encoding */
                    break;
                }
                shift += 7;
            }
            if (!ok)
                break;
            body = i;
        }
        Py_ssize_t end = body + rl;
        if (end - pos > maxsize || end > n)
            break;
        PyObject *pkt;
        if (b0 >= 0x30 && b0 < 0x40) {
            unsigned qos = (b0 >> 1) & 3;
            if (body + 2 > end)
                break;
            Py_ssize_t tl = ((Py_ssize_t)d[body] << 8) | d[body + 1];
            const unsigned char *tb = d + body + 2;
            Py_ssize_t p = body + 2 + tl;
            if (p > end || tl == 0)
                break;
            long pid = -1;
            if (qos) {
                if (qos == 3 || p + 2 > end)
                    break;
                pid = ((long)d[p] << 8) | d[p + 1];
                if (pid == 0)
                    break;
                p += 2;
            } else if (b0 & 8) {
                break;
            }
            if (level == 5) {
                if (p >= end || d[p] != 0)
                    break;  /* properties: the Python decoder */
                p += 1;
            }
            PyObject *topic;
            if (last_topic != NULL && tl == last_tl && memcmp(tb, last_tb, tl) == 0) {
                topic = Py_NewRef(last_topic);
            } else {
                /* '+', '#' and NUL are ASCII, never inside a multi-byte UTF-8 sequence:
                   scanning the bytes is the same test as scanning the str. */
                if (memchr(tb, '+', tl) || memchr(tb, '#', tl) || memchr(tb, 0, tl))
                    break;
                topic = PyUnicode_DecodeUTF8((const char *)tb, tl, NULL);
                if (topic == NULL) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                        return NULL;
                    PyErr_Clear();
                    break;  /* Python raises the malformed-packet error */
                }
                Py_XSETREF(last_topic, Py_NewRef(topic));
                last_tb = tb;
                last_tl = tl;
            }
            PyObject *argv[7];
            argv[0] = topic;
            argv[1] = PyBytes_FromStringAndSize((const char *)d + p, end - p);
            argv[2] = PyLong_FromLong(qos);
            argv[3] = (b0 & 1) ? Py_True : Py_False;
            argv[4] = (b0 & 8) ? Py_True : Py_False;
            argv[5] = pid < 0 ? Py_None : PyLong_FromLong(pid);
            argv[6] = Py_None;
            if (argv[1] == NULL || argv[2] == NULL || argv[5] == NULL) {
                Py_DECREF(topic);
                Py_XDECREF(argv[1]);
                Py_XDECREF(argv[2]);
                if (pid >= 0)
                    Py_XDECREF(argv[5]);
                Py_XDECREF(last_topic);
                return NULL;
            }
            pkt = PublishPlan.n ? plan_make(&PublishPlan, PublishCls, argv, 7)
                                : PyObject_Vectorcall(PublishCls, argv, 7, NULL);
            Py_DECREF(topic);
            Py_DECREF(argv[1]);
            Py_DECREF(argv[2]);
            if (pid >= 0)
                Py_DECREF(argv[5]);
        } else if (b0 == 0x40 && rl == 2) {
            long pid = ((long)d[body] << 8) | d[body + 1];
            if (pid == 0)
                break;
            PyObject *v = PyLong_FromLong(pid);
            if (v == NULL) {
                Py_XDECREF(last_topic);
                return NULL;
            }
            pkt = PubAckPlan.n ? plan_make(&PubAckPlan, PubAckCls, &v, 1)
                               : PyObject_Vectorcall(PubAckCls, &v, 1, NULL);
            Py_DECREF(v);
        } else {
            break;
        }
        if (pkt == NULL || PyList_Append(out, pkt) < 0) {
            Py_XDECREF(pkt);
            Py_XDECREF(last_topic);
            return NULL;
        }
        Py_DECREF(pkt);
        pos = end;
    }
    Py_XDECREF(last_topic);
    return PyLong_FromSsize_t(pos);
}


/* The topic (args[0], a str: its UTF-8 and length, at most 65535 bytes) and the first
   byte (args[2]) of a PUBLISH to encode; -1 with an exception set. Shared by publish_packet
   and publish_packet_pid. */
static int publish_topic_b0(PyObject *const *args, const char **tb, Py_ssize_t *tl, long *b0)
{
    *tb = PyUnicode_AsUTF8AndSize(args[0], tl);
    if (*tb == NULL)
        return -1;
    *b0 = PyLong_AsLong(args[2]);
    if (*b0 == -1 && PyErr_Occurred())
        return -1;
    if (*tl > 65535) {
        PyErr_SetString(PyExc_ValueError, "topic longer than 65535 bytes");
        return -1;
    }
    return 0;
}

/* The bytes of a PUBLISH before its topic: the first byte ``b0``, the remaining length
   ``rl`` (1 to 4 bytes) and the topic's length ``tl`` (2 bytes), into ``hdr`` (8 bytes);
   returns how many. Shared by publish_packet and publish_packet_pid. */
static int publish_header(unsigned char *hdr, long b0, Py_ssize_t rl, Py_ssize_t tl)
{
    int hl = 0;
    hdr[hl++] = (unsigned char)b0;
    Py_ssize_t v = rl;
    do {
        unsigned char b = v & 127;
        v >>= 7;
        if (v)
            b |= 128;
        hdr[hl++] = b;
    } while (v);
    hdr[hl++] = (unsigned char)(tl >> 8);
    hdr[hl++] = (unsigned char)(tl & 255);
    return hl;
}

/* publish_packet(topic: str, tail: bytes, b0: int, whole: bool)

   The bytes of one PUBLISH around its packet identifier, as codec.publish_parts encodes
   them: ``(head, tail)`` (``whole`` false), or for QoS 0 the single ``head + tail`` (``whole``
   true), which a fan-out writes to every subscriber of that shape without a concatenation
   per copy. ``tail`` is the payload (v5: properties + payload, built in Python). In Python the
   encode was ~11 % of the broker's CPU in the bench's QoS 0 profile (topic.encode, bytes of a
   tuple, two concatenations per message). Errors are the Python encoder's. */
static PyObject *py_publish_packet(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "publish_packet(str, bytes, b0, whole)");
        return NULL;
    }
    Py_ssize_t tl;
    const char *tb;
    long b0;
    if (publish_topic_b0(args, &tb, &tl, &b0) < 0)
        return NULL;
    int whole = PyObject_IsTrue(args[3]);
    if (whole < 0)
        return NULL;
    /* a payload that is not bytes (a memoryview of a log read) becomes bytes once here */
    PyObject *tail = PyBytes_Check(args[1]) ? Py_NewRef(args[1]) : PyBytes_FromObject(args[1]);
    if (tail == NULL)
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(tail);
    Py_ssize_t rl = tl + n + (((b0 >> 1) & 3) ? 4 : 2);
    if (rl > 268435455) {
        Py_DECREF(tail);
        PyErr_SetString(PyExc_ValueError, "PUBLISH larger than the maximum remaining length");
        return NULL;
    }
    unsigned char hdr[8];
    int hl = publish_header(hdr, b0, rl, tl);
    Py_ssize_t size = hl + tl + (whole ? n : 0);
    PyObject *head = PyBytes_FromStringAndSize(NULL, size);
    if (head == NULL) {
        Py_DECREF(tail);
        return NULL;
    }
    char *w = PyBytes_AS_STRING(head);
    memcpy(w, hdr, hl);
    memcpy(w + hl, tb, tl);
    if (whole) {
        memcpy(w + hl + tl, PyBytes_AS_STRING(tail), n);
        Py_DECREF(tail);
        return head;
    }
    PyObject *res = PyTuple_Pack(2, head, tail);
    Py_DECREF(head);
    Py_DECREF(tail);
    return res;
}

/* publish_packet_pid(topic: str, payload: bytes, b0: int, pid: int) -> bytes

   A whole v3.x QoS 1/2 PUBLISH with its packet identifier in place: what a subscriber's copy
   is, written once. _write_publish built it from Message.parts (a shape key, a dict, then
   publish_packet's (head, tail)) and two concatenations around ``pid.to_bytes``: a QoS 1 copy
   is seldom sent twice in one shape, so the shape cache only cost it (issue 25, logged QoS 1).
   Errors are publish_packet's. */
static PyObject *py_publish_packet_pid(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "publish_packet_pid(str, bytes, b0, pid)");
        return NULL;
    }
    Py_ssize_t tl;
    const char *tb;
    long b0;
    if (publish_topic_b0(args, &tb, &tl, &b0) < 0)
        return NULL;
    long pid = PyLong_AsLong(args[3]);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    if (pid < 1 || pid > 65535 || !((b0 >> 1) & 3)) {
        PyErr_SetString(PyExc_ValueError, "publish_packet_pid: QoS 1/2 and a pid of 1..65535");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = view.len;
    Py_ssize_t rl = tl + n + 4;
    if (rl > 268435455) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "PUBLISH larger than the maximum remaining length");
        return NULL;
    }
    unsigned char hdr[8];
    int hl = publish_header(hdr, b0, rl, tl);
    PyObject *out = PyBytes_FromStringAndSize(NULL, hl + tl + 2 + n);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *w = PyBytes_AS_STRING(out);
    memcpy(w, hdr, hl);
    memcpy(w + hl, tb, tl);
    w[hl + tl] = (char)(pid >> 8);
    w[hl + tl + 1] = (char)(pid & 255);
    memcpy(w + hl + tl + 2, view.buf, n);
    PyBuffer_Release(&view);
    return out;
}

/* slot_maker(cls, template, fields, required) -> a callable making instances of ``cls``

   A broker Message or Delivery made by its class runs a Python __init__ (a frame and 9-14
   slot stores), two or three per logged QoS 1 message (its Message, its subscriber's
   Delivery, and the Message a lagging session's log read rebuilds): ~0.12 us each (issue 25).
   The maker fills the slots itself: every slot starts as the template's value (an instance
   the class made: the __init__ defaults, so a slot added later gets its default here too),
   then the positional arguments go to ``fields`` in order (at least ``required`` of them).
   Only a class of __slots__ alone (no __dict__, no base but object, object's __new__, no
   finalizer) whose template holds immutable scalars (None, bool, int, float, str, bytes) is
   accepted: a shared mutable default would be shared by every instance. That the class's
   __init__ does nothing else is checked where the maker is made (broker/message.py compares
   an instance of each with the class's own, slot by slot). The cluster's decode_plain
   (cluster/_speedups.c) builds Messages the same way. */
#define MAKER_SLOTS 32
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t nslots, nfields, required;
    Py_ssize_t offset[MAKER_SLOTS];      /* every slot */
    PyObject *value[MAKER_SLOTS];        /* the template's value of each */
    Py_ssize_t field_offset[MAKER_SLOTS];
} SlotMaker;

static PyObject *maker_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames)
{
    SlotMaker *mk = (SlotMaker *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "slot maker: positional arguments only");
        return NULL;
    }
    if (nargs < mk->required || nargs > mk->nfields) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd to %zd arguments (%zd given)",
                     mk->cls->tp_name, mk->required, mk->nfields, nargs);
        return NULL;
    }
    PyObject *obj = mk->cls->tp_alloc(mk->cls, 0);  /* zeroed, GC-tracked, owns a type ref */
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < mk->nslots; i++)
        *(PyObject **)((char *)obj + mk->offset[i]) = Py_NewRef(mk->value[i]);
    for (Py_ssize_t j = 0; j < nargs; j++)
        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j]), Py_NewRef(args[j]));
    return obj;
}

static void maker_dealloc(PyObject *o)
{
    SlotMaker *mk = (SlotMaker *)o;
    for (Py_ssize_t i = 0; i < mk->nslots; i++)
        Py_CLEAR(mk->value[i]);
    Py_CLEAR(mk->cls);
    Py_TYPE(o)->tp_free(o);
}

static PyObject *maker_tp_call(PyObject *o, PyObject *args, PyObject *kw)
{
    return PyVectorcall_Call(o, args, kw);
}

static PyTypeObject SlotMakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker.protocol._speedups.SlotMaker",
    .tp_basicsize = sizeof(SlotMaker),
    .tp_dealloc = maker_dealloc,
    .tp_call = maker_tp_call,
    .tp_vectorcall_offset = offsetof(SlotMaker, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Makes instances of one slotted class without its __init__ (slot_maker).",
};

static Py_ssize_t member_offset(PyTypeObject *tp, PyObject *name)
{
    PyObject *descr = PyDict_GetItemWithError(tp->tp_dict, name);  /* borrowed */
    if (descr == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "slot_maker: %R is not a slot of the class", name);
        return -1;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "slot_maker: %R is not a slot", name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "slot_maker: %R is not a writable object slot", name);
        return -1;
    }
    return m->offset;
}

static int immutable_scalar(PyObject *v)
{
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v)
        || PyUnicode_CheckExact(v) || PyBytes_CheckExact(v);
}

static PyObject *py_slot_maker(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0]) || !PyTuple_Check(args[2])
            || !PyObject_TypeCheck(args[1], (PyTypeObject *)args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "slot_maker(cls, template: cls, fields: tuple[str], required: int)");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)args[0];
    PyObject *tmpl = args[1];
    if (Py_TYPE(tmpl) != tp || tp->tp_dictoffset != 0 || tp->tp_base != &PyBaseObject_Type
            || tp->tp_new != PyBaseObject_Type.tp_new || tp->tp_alloc != PyType_GenericAlloc
            || tp->tp_finalize != NULL || tp->tp_weaklistoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "slot_maker: a class of __slots__ only, with "
                                         "object's __new__ and no finalizer or weakrefs");
        return NULL;
    }
    Py_ssize_t required = PyLong_AsSsize_t(args[3]);
    if (required == -1 && PyErr_Occurred())
        return NULL;
    PyObject *slots = PyObject_GetAttrString((PyObject *)tp, "__slots__");
    if (slots == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(slots, "slot_maker: __slots__ is not a sequence");
    Py_DECREF(slots);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), nf = PyTuple_GET_SIZE(args[2]);
    if (n > MAKER_SLOTS || nf > n || required < 0 || required > nf) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "slot_maker: too many slots, or fields/required "
                                          "out of range");
        return NULL;
    }
    SlotMaker *mk = PyObject_New(SlotMaker, &SlotMakerType);
    if (mk == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    mk->vectorcall = maker_call;
    mk->cls = (PyTypeObject *)Py_NewRef(tp);
    mk->nslots = 0;
    mk->nfields = nf;
    mk->required = required;
    for (Py_ssize_t j = 0; j < nf; j++) {
        PyObject *name = PyTuple_GET_ITEM(args[2], j);
        int found = 0;
        for (Py_ssize_t i = 0; i < n && !found; i++) {
            int eq = PyObject_RichCompareBool(name, PySequence_Fast_GET_ITEM(seq, i), Py_EQ);
            if (eq < 0)
                goto fail;
            found = eq;
        }
        if (!found) {
            PyErr_Format(PyExc_TypeError, "slot_maker: field %R is not in __slots__", name);
            goto fail;
        }
        mk->field_offset[j] = member_offset(tp, name);
        if (mk->field_offset[j] < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t off = member_offset(tp, PySequence_Fast_GET_ITEM(seq, i));
        if (off < 0)
            goto fail;
        int given = 0;  /* a required field: always passed, its template value never used */
        for (Py_ssize_t j = 0; j < required; j++)
            given |= mk->field_offset[j] == off;
        PyObject *v = given ? Py_None : *(PyObject **)((char *)tmpl + off);
        if (v == NULL || !immutable_scalar(v)) {
            PyErr_Format(PyExc_TypeError, "slot_maker: the template's %R is unset or not an "
                         "immutable scalar", PySequence_Fast_GET_ITEM(seq, i));
            goto fail;
        }
        mk->offset[i] = off;
        mk->value[i] = Py_NewRef(v);
        mk->nslots = i + 1;
    }
    Py_DECREF(seq);
    return (PyObject *)mk;
fail:
    Py_DECREF(seq);
    Py_DECREF(mk);
    return NULL;
}

/* publish_run_end(packets: list, start, stop, qos, topic) -> end, or None

   broker/publishrun.py run_end: the index, from start + 1 up to stop, of the first packet
   that does not continue a run of plain publishes on ``topic`` at ``qos`` (a Publish, that
   QoS, not retained, not DUP, no properties, that topic): the scan of the dispatch loop's
   QoS 0 and QoS 1 runs, which was a Python step per packet. None when parse_run does not fill
   Publish's slots itself (plan not ready): the caller scans in Python. Only objects of the
   exact Publish class continue a run, as the Python test ``p.__class__ is Publish``. */
static PyObject *py_publish_run_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "publish_run_end(packets: list, start, stop, qos, "
                        "topic)");
        return NULL;
    }
    if (PublishPlan.n != 7)
        Py_RETURN_NONE;
    PyObject *packets = args[0], *topic = args[4];
    /* Nothing in this scan may run Python code: the packets and their slots are borrowed,
       and a __bool__ or __eq__ that emptied the list or reset a slot would leave them
       dangling (a segfault). So only what parse_run makes is judged here (an exact int QoS,
       the bools, an exact str topic); anything else, or arguments out of the ordinary
       (a start outside the list, a huge QoS), hands the whole scan to py_run_end (None). */
    if (!PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
            || !PyLong_CheckExact(args[3]) || !PyUnicode_CheckExact(topic))
        Py_RETURN_NONE;
    int overflow = 0;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    if (stop == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long qos = PyLong_AsLongAndOverflow(args[3], &overflow);
    Py_ssize_t n = PyList_GET_SIZE(packets);
    if (overflow || start < 0 || start >= n)
        Py_RETURN_NONE;
    if (stop > n)
        stop = n;
    Py_ssize_t end = start + 1;
    const Py_ssize_t *off = PublishPlan.offset;  /* topic, payload, qos, retain, dup, pid, props */
    for (; end < stop; end++) {
        PyObject *p = PyList_GET_ITEM(packets, end);
        if (!Py_IS_TYPE(p, (PyTypeObject *)PublishCls))
            break;
        PyObject *pq = *(PyObject **)((char *)p + off[2]);
        PyObject *pr = *(PyObject **)((char *)p + off[3]);
        PyObject *pd = *(PyObject **)((char *)p + off[4]);
        PyObject *pp = *(PyObject **)((char *)p + off[6]);
        PyObject *pt = *(PyObject **)((char *)p + off[0]);
        if (pq == NULL || pr == NULL || pd == NULL || pp == NULL || pt == NULL)
            Py_RETURN_NONE;  /* (an unset slot: Python raises AttributeError) */
        if (!PyLong_CheckExact(pq) || (pr != Py_False && pr != Py_True)
                || (pd != Py_False && pd != Py_True) || !PyUnicode_CheckExact(pt))
            Py_RETURN_NONE;  /* (not what parse_run makes: Python judges it) */
        if (pp != Py_None || pr == Py_True || pd == Py_True)
            break;
        long q = PyLong_AsLongAndOverflow(pq, &overflow);
        if (overflow || q != qos)
            break;
        /* (parse_run hands a repeated topic the same str: identity answers almost always;
           two exact str compare without Python code) */
        if (pt != topic && PyUnicode_Compare(pt, topic) != 0)
            break;
    }
    return PyLong_FromSsize_t(end);
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))py_setup, METH_FASTCALL,
     "setup(Publish, PubAck): the packet classes to build."},
    {"slots_ready", py_slots_ready, METH_NOARGS,
     "(Publish, PubAck): whether parse_run fills their slots without calling the class."},
    {"parse_run", (PyCFunction)(void (*)(void))py_parse_run, METH_FASTCALL,
     "The plain-packet loop of PacketParser.feed (see the C source)."},
    {"publish_packet", (PyCFunction)(void (*)(void))py_publish_packet, METH_FASTCALL,
     "A PUBLISH's (head, tail), or QoS 0's whole packet (see the C source)."},
    {"publish_packet_pid", (PyCFunction)(void (*)(void))py_publish_packet_pid, METH_FASTCALL,
     "A whole v3.x QoS 1/2 PUBLISH with its packet identifier (see the C source)."},
    {"publish_run_end", (PyCFunction)(void (*)(void))py_publish_run_end, METH_FASTCALL,
     "Where a run of plain publishes on one topic ends (broker/publishrun.py run_end)."},
    {"slot_maker", (PyCFunction)(void (*)(void))py_slot_maker, METH_FASTCALL,
     "slot_maker(cls, template, fields, required): makes cls instances without __init__."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "broker.protocol._speedups",
    "Compiled fast path of the MQTT codec (optional; see codec.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    if (PyType_Ready(&SlotMakerType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
