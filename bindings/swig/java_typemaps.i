/*
 * Java part of the SWIG interface, included by dstransformer.i under SWIGJAVA before the header is
 * parsed. It gives the raw layer (package org.dstransformer.internal, module class
 * dstransformer_native) these Java types; the idiomatic classes of org.dstransformer are built on it.
 *
 *  C                                         Java (raw layer)
 *  ----------------------------------------  --------------------------------------------------------
 *  dst_status (returned)                     void; a status other than DST_OK throws
 *                                            org.dstransformer.DstException(status, dst_last_error())
 *  dst_status status (the argument)          int
 *  enums                                     proper Java enums (dst_dtype.DST_DTYPE_FP32, ...)
 *  void *, const void * (data, streams)      long: an address in the context's memory space
 *  void ** (out)                             long[1]
 *  dst_context/dst_layer/dst_saved **out     long[1]: the new handle's address; wrap it with
 *                                            new SWIGTYPE_p_dst_layer(address, false)
 *  SWIGTYPE_p_* handle classes               public constructor and getCPtr()
 *  uint64_t                                  long (two's complement: seeds ≥ 2^63 are negative)
 *  uint64_t *, size_t * (out), int * (out)   long[1] / long[1] / int[1]
 *  (char *buf, size_t size) output buffers   byte[]: filled with a NUL-terminated string
 *  const char * members of                   copied into memory the struct owns (freed with it), so
 *  dst_checkpoint_options                    a Java String can be assigned safely
 *
 * Two Java-only helpers turn direct NIO buffers into addresses and back:
 *  long dstj_buffer_address(java.nio.Buffer direct)    start of the buffer (its position is not added)
 *  java.nio.ByteBuffer dstj_wrap_address(long, long)   a direct view of memory the library owns
 *
 * The JNI library is System.loadLibrary("dstransformer_java") (or System.load of the file named by
 * the system property org.dstransformer.library); when that fails the UnsatisfiedLinkError names the
 * library and java.library.path.
 */

%include "enums.swg"
%javaconst(1);

/* ---- handles: public constructors and getCPtr so that org.dstransformer can wrap them ----------- */
SWIG_JAVABODY_TYPEWRAPPER(public, protected, public, SWIGTYPE)

/* No finalize() (deprecated since Java 9): the proxies of structs are freed by delete(). */
%typemap(javafinalize) SWIGTYPE ""

/* ---- dst_status: DST_OK returns, anything else throws --------------------------------------------- */
%{
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dstransformer/dstransformer.h"

/* Throws org.dstransformer.DstException(status, dst_last_error()); RuntimeException if that class
   cannot be found (e.g. the raw layer used on its own). */
static void dstj_throw_status(JNIEnv *jenv, dst_status status) {
  const char *msg = dst_last_error();
  jclass cls;
  if (!msg) msg = "";
  cls = (*jenv)->FindClass(jenv, "org/dstransformer/DstException");
  if (cls) {
    jmethodID ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;)V");
    if (ctor) {
      jstring jmsg = (*jenv)->NewStringUTF(jenv, msg);
      if (jmsg) {
        jobject ex = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, jmsg);
        if (ex) (*jenv)->Throw(jenv, (jthrowable)ex);
      }
    }
    return; /* on any failure above, the JVM's own exception is pending */
  }
  (*jenv)->ExceptionClear(jenv);
  {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s: %s", dst_status_string(status), msg);
    SWIG_JavaThrowException(jenv, SWIG_JavaRuntimeException, buf);
  }
}
%}

%typemap(jni) dst_status "void"
%typemap(jtype) dst_status "void"
%typemap(jstype) dst_status "void"
%typemap(javaout) dst_status { $jnicall; }
/* Thrown from the "ret" typemap, which runs after the argout and freearg code: no JNI call follows
   the pending exception, and the arguments' JNI resources are released first. */
%typemap(out) dst_status ""
%typemap(ret) dst_status {
  if ($1 != DST_OK) dstj_throw_status(jenv, $1);
}

/* dst_status_string(dst_status status): the one place a status is an argument. */
%typemap(jni) dst_status status "jint"
%typemap(jtype) dst_status status "int"
%typemap(jstype) dst_status status "int"
%typemap(javain) dst_status status "$javainput"
%typemap(in) dst_status status %{ $1 = (dst_status)$input; %}

/* ---- data pointers as addresses ------------------------------------------------------------------ */
%typemap(jni) void *, const void * "jlong"
%typemap(jtype) void *, const void * "long"
%typemap(jstype) void *, const void * "long"
%typemap(javain) void *, const void * "$javainput"
%typemap(javaout) void *, const void * { return $jnicall; }
%typemap(in) void *, const void * %{ $1 = ($1_ltype)(uintptr_t)$input; %}
%typemap(out) void *, const void * %{ $result = (jlong)(uintptr_t)$1; %}
%typemap(memberin) void * %{ $1 = $input; %}

/* void ** out-parameters (dst_malloc, dst_context_get_stream, dst_layer_param_arena, ...). */
%typemap(jni) void ** "jlongArray"
%typemap(jtype) void ** "long[]"
%typemap(jstype) void ** "long[]"
%typemap(javain) void ** "$javainput"
%typemap(in) void ** (void *temp = NULL) {
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "$1_name: expected a long[] of length >= 1");
    return $null;
  }
  $1 = &temp;
}
%typemap(argout) void ** {
  jlong value$argnum = (jlong)(uintptr_t)temp$argnum;
  (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value$argnum);
}

/* ---- the create functions' handle out-parameters -------------------------------------------------- */
%define DSTJ_HANDLE_OUT(TYPE)
%typemap(jni) TYPE **out "jlongArray"
%typemap(jtype) TYPE **out "long[]"
%typemap(jstype) TYPE **out "long[]"
%typemap(javain) TYPE **out "$javainput"
%typemap(in) TYPE **out (TYPE *temp = NULL) {
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "out: expected a long[] of length >= 1");
    return $null;
  }
  $1 = &temp;
}
%typemap(argout) TYPE **out {
  jlong value$argnum = (jlong)(uintptr_t)temp$argnum;
  (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value$argnum);
}
%enddef
DSTJ_HANDLE_OUT(dst_context)
DSTJ_HANDLE_OUT(dst_layer)
DSTJ_HANDLE_OUT(dst_saved)
DSTJ_HANDLE_OUT(dst_optimizer)
DSTJ_HANDLE_OUT(dst_engine)
/* dst_engine_get_optimizer: the engine's optimizer, returned like a created handle. */
%apply dst_optimizer **out { dst_optimizer **opt };
/* dst_engine_loss_scale_pointer: the device address of the scale, in a long[1]. */
%typemap(jni) const float **scale "jlongArray"
%typemap(jtype) const float **scale "long[]"
%typemap(jstype) const float **scale "long[]"
%typemap(javain) const float **scale "$javainput"
%typemap(in) const float **scale (const float *temp = NULL) {
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "scale: expected a long[] of length >= 1");
    return $null;
  }
  $1 = ($1_ltype)&temp;
}
%typemap(argout) const float **scale {
  jlong value$argnum = (jlong)(uintptr_t)temp$argnum;
  (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value$argnum);
}

/* ---- 64-bit unsigned values and size_t / uint64_t out-parameters as Java longs -------------------- */
%apply long long { uint64_t };
/* Defined under the OUTPUT name too, so that dstransformer.i's %apply picks them up when this file
   is included before it; the named %apply below covers the other order. */
%apply long long *OUTPUT { size_t *OUTPUT, uint64_t *OUTPUT };
%apply long long *OUTPUT { size_t *bytes, size_t *client_state_len, size_t *summary_len, size_t *tag_len,
                           uint64_t *seed, uint64_t *offset, uint64_t *counter };
%apply int *OUTPUT { int *id, int *count, int *threads, dst_backend *backend, dst_param *param, int *index,
                     int *boundary, int *enabled, dst_index_checks *mode };
%apply float *OUTPUT { float *lr, float *norm };

/* ---- output character buffers as byte[] (a NUL-terminated string is written) --------------------- */
%typemap(jni) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) "jbyteArray"
%typemap(jtype) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) "byte[]"
%typemap(jstype) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) "byte[]"
%typemap(javain) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) "$javainput"
%typemap(in) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) {
  $1 = NULL;
  $2 = 0;
  if ($input) {
    $1 = (char *)(*jenv)->GetByteArrayElements(jenv, $input, NULL);
    if (!$1) return $null;
    $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
  }
}
%typemap(freearg) (char *client_state, size_t client_state_size), (char *summary, size_t summary_size),
    (char *reason, size_t reason_size), (char *tag, size_t tag_size) {
  if ($1) (*jenv)->ReleaseByteArrayElements(jenv, $input, (jbyte *)$1, 0);
}

/* ---- const char * members of dst_checkpoint_options: owned copies ------------------------------- */
%typemap(memberin) const char *prefix, const char *client_state {
  free((char *)$1);
  $1 = NULL;
  if ($input) {
    char *copy = (char *)malloc(strlen($input) + 1);
    if (copy) strcpy(copy, $input);
    $1 = copy;
  }
}
/* set_client_state(byte[]): any bytes with their length (client_state_len), owned like the members above. */
%typemap(jni) (const char *state_bytes, size_t state_len) "jbyteArray"
%typemap(jtype) (const char *state_bytes, size_t state_len) "byte[]"
%typemap(jstype) (const char *state_bytes, size_t state_len) "byte[]"
%typemap(javain) (const char *state_bytes, size_t state_len) "$javainput"
%typemap(in) (const char *state_bytes, size_t state_len) {
  $1 = NULL;
  $2 = 0;
  if ($input) {
    $1 = (const char *)(*jenv)->GetByteArrayElements(jenv, $input, NULL);
    if (!$1) return $null;
    $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
  }
}
%typemap(freearg) (const char *state_bytes, size_t state_len) {
  if ($1) (*jenv)->ReleaseByteArrayElements(jenv, $input, (jbyte *)$1, JNI_ABORT);
}
%extend dst_checkpoint_options {
  void set_client_state_bytes(const char *state_bytes, size_t state_len) {
    char *copy = NULL;
    free((char *)$self->client_state);
    $self->client_state = NULL;
    $self->client_state_len = 0;
    if (!state_bytes) return;
    copy = (char *)malloc(state_len + 1);
    if (!copy) return;
    if (state_len) memcpy(copy, state_bytes, state_len);
    copy[state_len] = '\0';
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

/* ---- NIO helpers -------------------------------------------------------------------------------- */
%typemap(in, numinputs=0) JNIEnv *jenv_ %{ $1 = jenv; %}
%typemap(jstype) jobject buffer "java.nio.Buffer"
%typemap(jtype) jobject buffer "java.nio.Buffer"
%typemap(jstype) jobject dstj_wrap_address "java.nio.ByteBuffer"
%typemap(jtype) jobject dstj_wrap_address "java.nio.ByteBuffer"

%inline %{
/* Address of the first element of a direct NIO buffer (its position is not added). Throws
   IllegalArgumentException for a heap buffer. */
jlong dstj_buffer_address(JNIEnv *jenv_, jobject buffer) {
  void *p;
  if (!buffer) {
    SWIG_JavaThrowException(jenv_, SWIG_JavaNullPointerException, "buffer is null");
    return 0;
  }
  p = (*jenv_)->GetDirectBufferAddress(jenv_, buffer);
  if (!p) {
    SWIG_JavaThrowException(jenv_, SWIG_JavaIllegalArgumentException,
                            "expected a direct buffer (ByteBuffer.allocateDirect)");
    return 0;
  }
  return (jlong)(uintptr_t)p;
}

/* A direct ByteBuffer of `bytes` bytes at `address` (big-endian until order() is set; the memory is
   not owned by the buffer). */
jobject dstj_wrap_address(JNIEnv *jenv_, jlong address, jlong bytes) {
  if (!address || bytes < 0) {
    SWIG_JavaThrowException(jenv_, SWIG_JavaIllegalArgumentException, "null address or negative size");
    return NULL;
  }
  return (*jenv_)->NewDirectByteBuffer(jenv_, (void *)(uintptr_t)address, bytes);
}
%}

/* ---- loading the JNI library ------------------------------------------------------------------------ */
%pragma(java) jniclasscode=%{
  /** Name of the JNI library, as System.loadLibrary takes it (libdstransformer_java.so on Linux). */
  public static final String LIBRARY_NAME = "dstransformer_java";

  static {
    String file = System.getProperty("org.dstransformer.library");
    try {
      if (file != null && !file.isEmpty()) {
        System.load(file);
      } else {
        System.loadLibrary(LIBRARY_NAME);
      }
    } catch (UnsatisfiedLinkError e) {
      UnsatisfiedLinkError error = new UnsatisfiedLinkError(
          "cannot load the native library of org.dstransformer: "
          + (file != null && !file.isEmpty() ? "file " + file + " (property org.dstransformer.library)"
                                             : System.mapLibraryName(LIBRARY_NAME) + " from java.library.path="
                                               + System.getProperty("java.library.path"))
          + ". It links libdstransformer.so." + dstransformer_nativeConstants.DST_VERSION_MAJOR
          + ", which the dynamic loader must find as well. Cause: "
          + e.getMessage());
      error.initCause(e);
      throw error;
    }
  }
%}
