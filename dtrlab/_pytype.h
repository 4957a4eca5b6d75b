/*
 * The fields every dtrlab extension type shares: a plain object (no subclasses, no GC) that
 * PyType_GenericNew allocates and its __init__ sets up. A type adds its method or attribute
 * tables after the macro:
 *
 *   static PyTypeObject ThingType = {
 *       DTRLAB_PLAIN_TYPE("dtrlab.runtime._mod.Thing", Thing, Thing_dealloc, Thing_init, "A thing."),
 *       .tp_methods = Thing_methods,
 *   };
 */
#ifndef DTRLAB_PYTYPE_H
#define DTRLAB_PYTYPE_H

#include <Python.h>

#define DTRLAB_PLAIN_TYPE(name, object, dealloc, init, doc) \
    PyVarObject_HEAD_INIT(NULL, 0)                           \
    .tp_name = (name),                                       \
    .tp_basicsize = sizeof(object),                          \
    .tp_dealloc = (destructor)(dealloc),                     \
    .tp_flags = Py_TPFLAGS_DEFAULT,                          \
    .tp_doc = (doc),                                         \
    .tp_init = (initproc)(init),                             \
    .tp_new = PyType_GenericNew

#endif
