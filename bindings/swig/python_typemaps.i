/*
 * Python part of the SWIG interface (included by dstransformer.i under SWIGPYTHON, before the header).
 *
 *  - A dst_status other than DST_OK raises an exception; the pure-Python package registers one class
 *    per status with dstpy_register_errors() (dstransformer/_errors.py); until then RuntimeError is
 *    raised. The exception is built as cls(status, message) with dst_last_error()'s text. A call that
 *    returns only a status returns None; out-parameters are returned instead (a list when several).
 *  - Data pointers (`void *`, `const void *`) cross as Python ints (uintptr); None is NULL.
 *  - Handles created by the *_create functions are returned as SWIG pointer objects that own
 *    nothing: the pure-Python classes destroy them.
 *  - `dst_layer *const *layers, int num_layers` takes a sequence of dst_layer pointers.
 *  - `(char *buf, size_t size)` output buffers take the buffer size as an int and return the string.
 */

%{
/* status -> exception class, filled by dstpy_register_errors(); NULL entries fall back to `default`. */
static PyObject *dstpy_error_table = NULL;   /* dict {int status: class} */
static PyObject *dstpy_error_default = NULL; /* class used for unknown statuses */

static void dstpy_raise(dst_status status) {
  const char *msg = dst_last_error();
  if (!msg) msg = "";
  PyObject *cls = NULL;
  if (dstpy_error_table) {
    PyObject *key = PyLong_FromLong((long)status);
    if (key) {
      cls = PyDict_GetItemWithError(dstpy_error_table, key); /* borrowed */
      Py_DECREF(key);
    }
    if (PyErr_Occurred()) return;
    if (!cls) cls = dstpy_error_default;
  }
  if (!cls) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", dst_status_string(status), msg);
    return;
  }
  PyObject *exc = PyObject_CallFunction(cls, "is", (int)status, msg);
  if (!exc) return; /* the constructor's own error stays set */
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
}

static int dstpy_as_pointer(PyObject *obj, void **out) {
  if (obj == Py_None) {
    *out = NULL;
    return 0;
  }
  if (!PyLong_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "expected an integer address (uintptr) or None, got %s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  void *p = PyLong_AsVoidPtr(obj);
  if (!p && PyErr_Occurred()) return -1;
  *out = p;
  return 0;
}
%}

%inline %{
/* Registers the exception classes: `table` maps an int status to a class, `fallback` is used for
   statuses missing from it. Both are called as cls(status, message). */
PyObject *dstpy_register_errors(PyObject *table, PyObject *fallback) {
  if (!PyDict_Check(table)) {
    PyErr_SetString(PyExc_TypeError, "dstpy_register_errors: table must be a dict");
    return NULL;
  }
  Py_INCREF(table);
  Py_XDECREF(dstpy_error_table);
  dstpy_error_table = table;
  Py_INCREF(fallback);
  Py_XDECREF(dstpy_error_default);
  dstpy_error_default = fallback;
  Py_RETURN_NONE;
}
%}

/* ---- status ---------------------------------------------------------------------------------- */
%typemap(out) dst_status {
  if ($1 != DST_OK) {
    dstpy_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}

/* ---- data pointers as integers ---------------------------------------------------------------- */
%typemap(in) void *, const void * {
  if (dstpy_as_pointer($input, (void **)&$1) != 0) SWIG_fail;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) void *, const void * {
  $1 = ($input == Py_None || PyLong_Check($input)) ? 1 : 0;
}
%typemap(out) void * {
  $result = PyLong_FromVoidPtr($1);
}

/* void ** out-parameters: dst_malloc, dst_layer_param_arena, dst_layer_grad_arena, dst_context_get_stream */
%typemap(in, numinputs=0) void ** (void *temp = NULL) {
  $1 = &temp;
}
%typemap(argout) void ** {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(temp$argnum));
}

/* ---- handles returned by the create functions ------------------------------------------------- */
%typemap(in, numinputs=0) SWIGTYPE **out ($*1_ltype temp = NULL) {
  $1 = &temp;
}
%typemap(argout) SWIGTYPE **out {
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj((void *)temp$argnum, $*1_descriptor, 0));
}

/* The engine's optimizer (dst_engine_get_optimizer): a handle the engine owns. */
%apply SWIGTYPE **out { dst_optimizer **opt };
/* dst_engine_loss_scale_pointer: the device address of the scale, as an int. */
%typemap(in, numinputs=0) const float **scale (const float *temp = NULL) {
  $1 = ($1_ltype)&temp;
}
%typemap(argout) const float **scale {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr((void *)temp$argnum));
}

/* ---- layer arrays ------------------------------------------------------------------------------ */
%typemap(in) (dst_layer *const *layers, int num_layers) (dst_layer **arr = NULL) {
  PyObject *seq = PySequence_Fast($input, "layers must be a sequence of dst_layer handles");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > INT32_MAX) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "layers: too many layers");
    SWIG_fail;
  }
  arr = (dst_layer **)calloc(n > 0 ? (size_t)n : 1, sizeof(dst_layer *));
  if (!arr) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    SWIG_fail;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    void *p = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(PySequence_Fast_GET_ITEM(seq, i), &p, $descriptor(dst_layer *), 0))) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "layers[%zd] is not a dst_layer handle", i);
      SWIG_fail;
    }
    arr[i] = (dst_layer *)p;
  }
  Py_DECREF(seq);
  $1 = arr;
  $2 = (int)n;
}
%typemap(freearg) (dst_layer *const *layers, int num_layers) {
  free(arr$argnum);
}

/* ---- output string buffers: the Python argument is the buffer size ----------------------------- */
%typemap(in) (char *client_state, size_t client_state_size) (char *buf = NULL, size_t cap = 0) {
  if ($input != Py_None) {
    Py_ssize_t n = PyLong_AsSsize_t($input);
    if (n < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "buffer size must be >= 0");
      SWIG_fail;
    }
    cap = (size_t)n;
    if (cap > 0) {
      buf = (char *)calloc(cap, 1);
      if (!buf) {
        PyErr_NoMemory();
        SWIG_fail;
      }
    }
  }
  $1 = buf;
  $2 = cap;
}
%typemap(freearg) (char *client_state, size_t client_state_size) {
  free(buf$argnum);
}
%apply (char *client_state, size_t client_state_size) { (char *summary, size_t summary_size),
                                                       (char *reason, size_t reason_size),
                                                       (char *tag, size_t tag_size) };
/* The summary, a config's rejection reason and a checkpoint tag are text: a str up to the NUL. */
%typemap(argout) (char *summary, size_t summary_size), (char *reason, size_t reason_size),
                 (char *tag, size_t tag_size) {
  PyObject *s;
  if (buf$argnum) {
    s = PyUnicode_DecodeUTF8(buf$argnum, (Py_ssize_t)strnlen(buf$argnum, cap$argnum), "replace");
    if (!s) SWIG_fail;
  } else {
    s = SWIG_Py_Void();
  }
  $result = SWIG_Python_AppendOutput($result, s);
}
/* The client state is bytes (NUL included): the whole buffer; the caller cuts it to the reported length. */
%typemap(argout) (char *client_state, size_t client_state_size) {
  PyObject *s;
  if (buf$argnum) {
    s = PyBytes_FromStringAndSize(buf$argnum, (Py_ssize_t)cap$argnum);
    if (!s) SWIG_fail;
  } else {
    s = SWIG_Py_Void();
  }
  $result = SWIG_Python_AppendOutput($result, s);
}

/* ---- const char * members of dst_checkpoint_options: own a copy, free the previous one -------- */
/* dst_checkpoint_options_default() sets both to NULL and the library never writes them, so every
   non-NULL value was allocated here. */
%typemap(memberin) const char *prefix, const char *client_state {
  free((char *)$1);
  if ($input) {
    size_t size = strlen((const char *)$input) + 1;
    char *copy = (char *)malloc(size);
    if (!copy) {
      $1 = NULL;
      PyErr_NoMemory();
      SWIG_fail;
    }
    memcpy(copy, $input, size);
    $1 = copy;
  } else {
    $1 = NULL;
  }
}
/* set_client_state(bytes): any bytes with their length (client_state_len), owned like the members above. */
%typemap(in) (const char *state_bytes, size_t state_len) (char *data = NULL, Py_ssize_t n = 0) {
  if (!PyBytes_Check($input)) {
    PyErr_SetString(PyExc_TypeError, "client_state: expected bytes");
    SWIG_fail;
  }
  if (PyBytes_AsStringAndSize($input, &data, &n) < 0) SWIG_fail;
  $1 = data;
  $2 = (size_t)n;
}
%extend dst_checkpoint_options {
  void set_client_state(const char *state_bytes, size_t state_len) {
    char *copy = (char *)malloc(state_len + 1);
    if (!copy) return;
    if (state_len) memcpy(copy, state_bytes, state_len);
    copy[state_len] = '\0';
    free((char *)$self->client_state);
    $self->client_state = copy;
    $self->client_state_len = state_len;
  }
  dst_checkpoint_options() {
    dst_checkpoint_options *o = (dst_checkpoint_options *)calloc(1, sizeof(dst_checkpoint_options));
    if (o) dst_checkpoint_options_default(o);
    return o;
  }
  ~dst_checkpoint_options() {
    free((char *)$self->prefix);
    free((char *)$self->client_state);
    free($self);
  }
}
