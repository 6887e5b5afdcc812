/* The stat cache's hot loop (scan.py, Scanner._walk_in): which of a folder's listed names
   its cached stat keys do not vouch for. The same answer as scan.py's _changed_py; in C
   because building an os.stat_result per file (three float and three nanosecond times) and
   the bytecode around it cost as much as the fstatat calls themselves: a command's step
   after one changed file in 50,000 took more than `git status`, which lstats in C.

   changed(dir_fd, names, cached) -> the names, in order, that are not cached as a file
   whose key (ctime_ns, size, inode) is this lstat's: not cached, cached racy (key None),
   not lstat'able, or different. The GIL is held (a release per call costs more than the
   call), and let go every 1,024 names so that a huge folder does not stall the process's
   other threads (a lease's heartbeat). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

/* 1: `name` (in the folder `fd` holds) lstats to `key` (ctime_ns, size, inode: plain ints);
   0: not, or no lstat; -1: an error of Python's (none is expected). */
static int
same_key(long fd, const char *name, PyObject *key)
{
    struct stat st;
    if (fstatat((int)fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    /* os.stat's st_ctime_ns: seconds * 10^9 + nanoseconds, in 64 bits until 2262. */
    if (st.st_ctim.tv_sec > 9000000000LL || st.st_ctim.tv_sec < -9000000000LL)
        return 0;
    long long ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
    int overflow = 0;
    long long c = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(key, 0), &overflow);
    if (overflow || (c == -1 && PyErr_Occurred()) || c != ctime_ns)
        return PyErr_Occurred() ? -1 : 0;
    long long size = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(key, 1), &overflow);
    if (overflow || (size == -1 && PyErr_Occurred()) || size != (long long)st.st_size)
        return PyErr_Occurred() ? -1 : 0;
    unsigned long long i = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 2));
    if (i == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear(); /* negative, or over 64 bits: no inode */
        return 0;
    }
    return i == (unsigned long long)st.st_ino;
}

static PyObject *
changed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "changed(dir_fd, names, cached)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return NULL;
    }
    PyObject *names = args[1], *cached = args[2];
    if (!PyList_Check(names) || !PyDict_Check(cached)) {
        PyErr_SetString(PyExc_TypeError, "changed(dir_fd, list, dict)");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        if ((i & 1023) == 1023) {
            /* No borrowed reference is held here: the list and dict are read afresh. */
            Py_BEGIN_ALLOW_THREADS
            Py_END_ALLOW_THREADS
        }
        PyObject *name = PyList_GET_ITEM(names, i);
        PyObject *row = PyDict_GetItemWithError(cached, name);
        int same = 0;
        if (row == NULL && PyErr_Occurred())
            goto fail;
        /* A name with a NUL in it (none is listed) would be cut short by fstatat. */
        if (row != NULL && PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 2 &&
            PyBytes_Check(name) &&
            strlen(PyBytes_AS_STRING(name)) == (size_t)PyBytes_GET_SIZE(name)) {
            PyObject *key = PyTuple_GET_ITEM(row, 0);
            /* Plain ints only: converting anything else could run Python code. */
            if (PyTuple_Check(key) && PyTuple_GET_SIZE(key) == 3 &&
                PyLong_CheckExact(PyTuple_GET_ITEM(key, 0)) &&
                PyLong_CheckExact(PyTuple_GET_ITEM(key, 1)) &&
                PyLong_CheckExact(PyTuple_GET_ITEM(key, 2))) {
                same = same_key(fd, PyBytes_AS_STRING(name), key);
                if (same < 0)
                    goto fail;
            }
        }
        if (!same && PyList_Append(out, name) < 0)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"changed", (PyCFunction)(void (*)(void))changed, METH_FASTCALL,
     "changed(dir_fd, names, cached) -> the names whose lstat key is not cached[name][0]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_statcache", NULL, 0, methods};

PyMODINIT_FUNC
PyInit__statcache(void)
{
    return PyModule_Create(&module);
}
