/* The stat cache's hot loops, each the same answer as a Python twin (used where this cannot
   be built), in C because a Python loop of a few operations per file costs a microsecond or
   more, and a workspace has 50,000 files or more:

   - listing: a folder's names, sorted (scan.py, _listing_py);
   - changed: which of a folder's listed names the cached stat keys do not vouch for (scan.py,
     _changed_py);
   - index_files: git's index parsed, and the lstat of its files in threads compared with
     what it recorded (git_index.py, _index_files_py);
   - seeded: a fresh scanner's folder, its files git's index vouches for made entries
     (scan.py, _seeded_py);
   - bucketed, bucket_lines, joined: a tree id's buckets and lines (manifest.py);
   - json_rows: a whole manifest's stored rows (manifest.py, encode_full).

   changed(dir_fd, names, cached) -> the names, in order, that are not cached as a file
   whose stat key (TAIL bytes: ctime_ns, size, inode, permission bits) is this lstat's: not
   cached, cached racy (key None), not lstat'able, or different. In C because building an
   os.stat_result per file (three float and three nanosecond times) and the bytecode around
   it cost as much as the fstatat calls themselves: a command's step after one changed file
   in 50,000 took more than `git status`, which lstats in C. The GIL is held (a release per
   call costs more than the call), and let go every 1,024 names so that a huge folder does
   not stall the process's other threads (a lease's heartbeat). */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memrchr, O_PATH */
#include <Python.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <pthread.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <structmember.h>

#define TAIL 28 /* a stat key, git_index.RECORD_TAIL: ctime_ns, size, inode (64 bits each);
                   permission bits, in the machine's byte order */

/* `st`'s stat key into `out`; 0 where its change time is past what 64 bits of nanoseconds
   hold (os.stat's st_ctime_ns then is no plain int: such a file has none). */
static int
stat_key(const struct stat *st, unsigned char *out)
{
    if (st->st_ctim.tv_sec > 9000000000LL || st->st_ctim.tv_sec < -9000000000LL)
        return 0;
    long long ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    long long size = (long long)st->st_size;
    unsigned long long ino = (unsigned long long)st->st_ino;
    unsigned int mode = st->st_mode & 0777;
    memcpy(out, &ctime_ns, 8);
    memcpy(out + 8, &size, 8);
    memcpy(out + 16, &ino, 8);
    memcpy(out + 24, &mode, 4);
    return 1;
}

/* 1: `name` (in the folder `fd` holds) lstats to `key` (a stat key: TAIL bytes); 0: not,
   or no lstat. Touches nothing of Python's (a Preload's threads call it). */
static int
same_key(int fd, const char *name, const unsigned char *key)
{
    struct stat st;
    unsigned char now[TAIL];
    return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && stat_key(&st, now) &&
           memcmp(now, key, TAIL) == 0;
}

/* A folder's fd given from Python; -1 with the exception set when it cannot be one. */
static int
fd_arg(PyObject *value)
{
    long fd = PyLong_AsLong(value);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return -1;
    }
    return fd;
}

typedef struct Preload Preload;
static int preloaded(Preload *pre, Py_ssize_t folder, PyObject *name, PyObject *row);

/* changed's answer for the folder `fd` holds; where `pre` is given, its verdicts on the
   rows it checked (in its folder `folder`) stand for their lstat calls. */
static PyObject *
unvouched(int fd, PyObject *names, PyObject *cached, Preload *pre, Py_ssize_t folder)
{
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
            if (PyBytes_Check(key) && PyBytes_GET_SIZE(key) == TAIL) {
                same = pre != NULL ? preloaded(pre, folder, name, row) : -1;
                if (same < 0) /* (not among the rows `pre` checked) */
                    same = same_key(fd, PyBytes_AS_STRING(name),
                                    (const unsigned char *)PyBytes_AS_STRING(key));
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

static PyObject *
changed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "changed(dir_fd, names, cached)");
        return NULL;
    }
    int fd = fd_arg(args[0]);
    if (fd < 0)
        return NULL;
    if (!PyList_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "changed(dir_fd, list, dict)");
        return NULL;
    }
    return unvouched(fd, args[1], args[2], NULL, -1);
}


/* -- a folder's names (scan.py, _listing_py) ------------------------------------------------ */

static int
by_bytes(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names in the folder `dir` (closed here, its offset left at the start), but `.` and
   `..`: `*text_out` holds them NUL-ended, `*names_out` points at each, sorted as bytes, and
   `*count_out` says how many (both free()d by the caller). 0, or an errno. Touches nothing
   of Python's. */
static int
read_names(DIR *dir, char **text_out, char ***names_out, Py_ssize_t *count_out)
{
    char *text = NULL, **names = NULL;
    Py_ssize_t len = 0, cap = 0, count = 0;
    int error = 0;
    rewinddir(dir);
    for (;;) {
        errno = 0;
        struct dirent *ent = readdir(dir);
        if (ent == NULL) {
            error = errno;
            break;
        }
        const char *name = ent->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
            continue;
        size_t n = strlen(name) + 1;
        if (len + (Py_ssize_t)n > cap) {
            Py_ssize_t grown = (len + (Py_ssize_t)n) * 2 + 4096;
            char *more = realloc(text, grown);
            if (more == NULL) {
                error = ENOMEM;
                break;
            }
            text = more;
            cap = grown;
        }
        memcpy(text + len, name, n);
        len += (Py_ssize_t)n;
        count++;
    }
    rewinddir(dir); /* (the offset is the fd's too: left as os.listdir leaves it) */
    closedir(dir);
    if (!error && count > 0) {
        names = malloc(count * sizeof(char *));
        if (names == NULL)
            error = ENOMEM;
        for (Py_ssize_t i = 0, at = 0; names != NULL && i < count; i++) {
            names[i] = text + at;
            at += (Py_ssize_t)strlen(text + at) + 1;
        }
        if (names != NULL)
            qsort(names, count, sizeof(char *), by_bytes);
    }
    if (error) {
        free(names);
        free(text);
        return error;
    }
    *text_out = text;
    *names_out = names;
    *count_out = count;
    return 0;
}

static PyObject *
names_list(char **names, Py_ssize_t count)
{
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *name = PyBytes_FromString(names[i]);
        if (name == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, name);
    }
    return out;
}

/* listing(dir_fd) -> the names in the folder `dir_fd` holds (but `.` and `..`), as bytes,
   sorted: what os.listdir gives of the fd, encoded back and sorted (scan._listing_py),
   without a str made and encoded again per name. Read through a duplicate of the fd, as
   os.listdir reads it (a folder that may be listed but not searched is listed). */
static PyObject *
listing(PyObject *module, PyObject *arg)
{
    int fd = fd_arg(arg);
    if (fd < 0)
        return NULL;
    char *text = NULL, **names = NULL;
    Py_ssize_t count = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *dir = copy >= 0 ? fdopendir(copy) : NULL;
    if (dir == NULL) {
        error = errno;
        if (copy >= 0)
            close(copy);
    }
    else
        error = read_names(dir, &text, &names, &count);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    else
        out = names_list(names, count);
    free(names);
    free(text);
    return out;
}

/* -- git's index, and the lstat of its files in threads (git_index.py, _index_files_py) --- */

static unsigned int
be32(const unsigned char *p)
{
    return ((unsigned int)p[0] << 24) | ((unsigned int)p[1] << 16) | ((unsigned int)p[2] << 8) |
           (unsigned int)p[3];
}

static unsigned int
be16(const unsigned char *p)
{
    return ((unsigned int)p[0] << 8) | (unsigned int)p[1];
}

static void
put_be32(unsigned char *p, unsigned int v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* -- chunks of work in threads (index_files, preload) --------------------------------------- */

/* Work cut into chunks, done in order by threads from the moment it is known while Python
   goes on, and by the caller: it waits only for a chunk not done yet, and takes one itself
   when no thread has (with no thread to be had, it does every chunk). Embedded in its
   owner, whose `work` finds it by offset; `work` touches nothing of Python's. */
typedef struct chunk_pool {
    void (*work)(struct chunk_pool *pool, Py_ssize_t c);
    Py_ssize_t chunks;
    Py_ssize_t next;      /* the next chunk no one took yet (atomic) */
    unsigned char *done;  /* per chunk: 1 once done (atomic); NULL: not made */
    pthread_mutex_t lock; /* (with `ready`: a chunk done; the owner's too) */
    pthread_cond_t ready;
    pthread_t ids[16];
    int started;
} chunk_pool;

/* 0, or -1 with MemoryError set. Once this is called, pool_end may be. */
static int
pool_init(chunk_pool *pool, Py_ssize_t chunks, void (*work)(chunk_pool *, Py_ssize_t))
{
    pool->work = work;
    pool->chunks = chunks;
    pool->next = 0;
    pool->started = 0;
    pool->done = PyMem_Calloc(chunks ? chunks : 1, 1);
    if (pool->done == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->ready, NULL);
    return 0;
}

static void
pool_do(chunk_pool *pool, Py_ssize_t c)
{
    pool->work(pool, c);
    pthread_mutex_lock(&pool->lock);
    __atomic_store_n(&pool->done[c], 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool->ready);
    pthread_mutex_unlock(&pool->lock);
}

/* A thread: chunks, until none is left. */
static void *
pool_thread(void *arg)
{
    chunk_pool *pool = arg;
    for (;;) {
        Py_ssize_t c = __atomic_fetch_add(&pool->next, 1, __ATOMIC_RELAXED);
        if (c >= pool->chunks)
            return NULL;
        pool_do(pool, c);
    }
}

/* Up to `threads` threads (at most 16, no more than the chunks); fewer where no more can
   be had. */
static void
pool_start(chunk_pool *pool, long threads)
{
    if (threads > pool->chunks)
        threads = pool->chunks;
    if (threads > 16)
        threads = 16;
    for (long t = 0; t < threads; t++) {
        if (pthread_create(&pool->ids[pool->started], NULL, pool_thread, pool) != 0)
            break;
        pool->started++;
    }
}

/* Until chunk `c` is done, taking chunks no one took meanwhile (the GIL let go while it
   waits or works). */
static void
pool_wait(chunk_pool *pool, Py_ssize_t c)
{
    if (__atomic_load_n(&pool->done[c], __ATOMIC_ACQUIRE))
        return;
    Py_BEGIN_ALLOW_THREADS
    while (!__atomic_load_n(&pool->done[c], __ATOMIC_ACQUIRE)) {
        Py_ssize_t mine = __atomic_fetch_add(&pool->next, 1, __ATOMIC_RELAXED);
        if (mine < pool->chunks) {
            pool_do(pool, mine);
            continue;
        }
        pthread_mutex_lock(&pool->lock);
        while (!__atomic_load_n(&pool->done[c], __ATOMIC_ACQUIRE))
            pthread_cond_wait(&pool->ready, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
    }
    Py_END_ALLOW_THREADS
}

/* No chunk is taken any more; those under way end, their threads joined (the GIL let go). */
static void
pool_end(chunk_pool *pool)
{
    if (pool->done == NULL)
        return;
    if (pool->started) {
        __atomic_store_n(&pool->next, pool->chunks, __ATOMIC_RELAXED);
        Py_BEGIN_ALLOW_THREADS
        for (int t = 0; t < pool->started; t++)
            pthread_join(pool->ids[t], NULL);
        Py_END_ALLOW_THREADS
        pool->started = 0;
    }
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->ready);
    PyMem_Free(pool->done);
    pool->done = NULL;
}

/* -- the stat cache's lstat calls, ahead of a walk in threads (scan.py, Scanner._walk_all) - */

/* A cached file whose stat key a Preload checks. */
typedef struct {
    PyObject *row;         /* its cached row, (key, entry): a strong reference, so that its
                              address names it as long as the Preload lives */
    PyObject *name;        /* (a strong reference) */
    Py_ssize_t folder;
    unsigned char key[TAIL];
    int same;              /* (once its chunk is done) 1: its lstat is `key` */
} preload_entry;

typedef struct {
    char *path;            /* relative to the workspace, NUL-ended ("." for it) */
    Py_ssize_t first, count; /* its entries */
    Py_ssize_t chunk;
    int opened;            /* (once its chunk is done) 1: the folder of `dev` and `ino` had
                              the lstat calls */
    unsigned long long dev, ino;
} preload_folder;

/* The stat cache's lstat calls and key comparisons for a whole walk (git's preload-index),
   made in threads from the moment the walk starts, folder by folder in the cache's order,
   which is the walk's: the walk's `changed` for a folder then waits only for a chunk not
   done yet. A verdict is used only for the row it was made for (the same object, at the
   same name), in the folder the walk opened itself (the same device and inode): a folder
   swapped since, or reached through a link, is lstat'ed by the walk. */
struct Preload {
    PyObject_HEAD
    preload_entry *entries;
    Py_ssize_t count;
    preload_folder *folders;
    Py_ssize_t nfolders;
    Py_ssize_t *chunk_from; /* per chunk: its first folder; then nfolders */
    Py_ssize_t *slots;      /* a row's address -> its entry + 1 (open addressing; 0: free) */
    Py_ssize_t nslots;      /* a power of two, twice the entries or more */
    PyObject *by_path;      /* a folder's path (bytes) -> its index (int) */
    int root_fd;            /* the workspace (a duplicate, owned) */
    chunk_pool pool;
};

static Py_ssize_t
slot_of(Preload *pre, PyObject *row)
{
    return (Py_ssize_t)(((uintptr_t)row >> 4) * 0x9E3779B97F4A7C15ull >> 7) & (pre->nslots - 1);
}

static void
preload_chunk(chunk_pool *pool, Py_ssize_t c)
{
    Preload *pre = (Preload *)((char *)pool - offsetof(Preload, pool));
    for (Py_ssize_t k = pre->chunk_from[c]; k < pre->chunk_from[c + 1]; k++) {
        preload_folder *f = &pre->folders[k];
        struct stat st;
        int fd = openat(pre->root_fd, f->path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        if (fstat(fd, &st) == 0) {
            f->dev = (unsigned long long)st.st_dev;
            f->ino = (unsigned long long)st.st_ino;
            f->opened = 1;
            for (Py_ssize_t i = f->first; i < f->first + f->count; i++) {
                preload_entry *e = &pre->entries[i];
                e->same = same_key(fd, PyBytes_AS_STRING(e->name), e->key);
            }
        }
        close(fd);
    }
}

/* 1 or 0: `pre`'s verdict on `row` at `name` in its folder `folder`; -1: it has none. */
static int
preloaded(Preload *pre, Py_ssize_t folder, PyObject *name, PyObject *row)
{
    for (Py_ssize_t at = slot_of(pre, row);; at = (at + 1) & (pre->nslots - 1)) {
        Py_ssize_t i = pre->slots[at] - 1;
        if (i < 0)
            return -1;
        preload_entry *e = &pre->entries[i];
        if (e->row != row)
            continue;
        Py_ssize_t len = PyBytes_GET_SIZE(name);
        if (e->folder != folder ||
            (e->name != name && (PyBytes_GET_SIZE(e->name) != len ||
                                 memcmp(PyBytes_AS_STRING(e->name), PyBytes_AS_STRING(name),
                                        len) != 0)))
            return -1;
        return e->same;
    }
}

/* A folder a Preload can list: its path (bytes) with no NUL in it, its rows a dict. */
static int
listable(PyObject *path, PyObject *rows)
{
    return PyBytes_Check(path) && PyDict_Check(rows) &&
           memchr(PyBytes_AS_STRING(path), '\0', PyBytes_GET_SIZE(path)) == NULL;
}

/* A row a Preload can check: (key, entry) with a key of TAIL bytes, at a name with no NUL
   or slash in it. */
static int
checkable(PyObject *name, PyObject *row)
{
    if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) == 0 ||
        memchr(PyBytes_AS_STRING(name), '\0', PyBytes_GET_SIZE(name)) != NULL ||
        memchr(PyBytes_AS_STRING(name), '/', PyBytes_GET_SIZE(name)) != NULL ||
        !PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2)
        return 0;
    PyObject *key = PyTuple_GET_ITEM(row, 0);
    return PyBytes_Check(key) && PyBytes_GET_SIZE(key) == TAIL;
}

static void
Preload_dealloc(Preload *pre)
{
    pool_end(&pre->pool);
    if (pre->root_fd >= 0)
        close(pre->root_fd);
    for (Py_ssize_t i = 0; pre->entries != NULL && i < pre->count; i++) {
        Py_XDECREF(pre->entries[i].row);
        Py_XDECREF(pre->entries[i].name);
    }
    for (Py_ssize_t k = 0; pre->folders != NULL && k < pre->nfolders; k++)
        PyMem_Free(pre->folders[k].path);
    PyMem_Free(pre->entries);
    PyMem_Free(pre->folders);
    PyMem_Free(pre->chunk_from);
    PyMem_Free(pre->slots);
    Py_XDECREF(pre->by_path);
    Py_TYPE(pre)->tp_free((PyObject *)pre);
}

/* changed(dir_fd, rel_dir, names, cached): _speedups.changed's answer for the folder
   `dir_fd` holds, at `rel_dir`, with the lstat calls made ahead where they were. */
static PyObject *
Preload_changed(Preload *pre, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "changed(dir_fd, rel_dir: bytes, names: list, "
                                         "cached: dict)");
        return NULL;
    }
    int fd = fd_arg(args[0]);
    if (fd < 0)
        return NULL;
    PyObject *index = PyDict_GetItemWithError(pre->by_path, args[1]);
    if (index == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t k = index != NULL ? PyLong_AsSsize_t(index) : -1;
    struct stat st;
    if (k >= 0) {
        pool_wait(&pre->pool, pre->folders[k].chunk);
        preload_folder *f = &pre->folders[k];
        if (!f->opened || fstat(fd, &st) != 0 || (unsigned long long)st.st_dev != f->dev ||
            (unsigned long long)st.st_ino != f->ino)
            k = -1; /* not the folder the lstat calls were made in: the walk makes its own */
    }
    return unvouched(fd, args[2], args[3], k >= 0 ? pre : NULL, k);
}

static PyMethodDef Preload_methods[] = {
    {"changed", (PyCFunction)(void (*)(void))Preload_changed, METH_FASTCALL,
     "changed(dir_fd, rel_dir, names, cached) -> _speedups.changed's answer, of the lstat "
     "calls made ahead"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PreloadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "durable_agent.workspace._speedups.Preload",
    .tp_basicsize = sizeof(Preload),
    .tp_dealloc = (destructor)Preload_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The stat cache's lstat calls for a walk, made in threads (preload).",
    .tp_methods = Preload_methods,
};

#define PRELOAD_CHUNK 512 /* cached files a chunk (whole folders): a few hundred µs of lstat */

/* preload(root_fd, cache, threads) -> a Preload: the lstat calls of every row of `cache`
   (folder path -> name -> (key, entry), Scanner._cache) with a key, in `threads` threads
   and the caller's. */
static PyObject *
preload(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "preload(root_fd, cache: dict, threads)");
        return NULL;
    }
    int root_fd = fd_arg(args[0]);
    long threads = PyLong_AsLong(args[2]);
    if (root_fd < 0 || (threads == -1 && PyErr_Occurred()))
        return NULL;
    PyObject *cache = args[1], *path, *rows, *name, *row;
    Py_ssize_t pos = 0, count = 0, nfolders = 0;
    while (PyDict_Next(cache, &pos, &path, &rows)) {
        if (!listable(path, rows))
            continue;
        Py_ssize_t inner = 0, n = 0;
        while (PyDict_Next(rows, &inner, &name, &row))
            n += checkable(name, row);
        count += n;
        nfolders += n > 0;
    }
    Preload *pre = PyObject_New(Preload, &PreloadType);
    if (pre == NULL)
        return NULL;
    pre->count = pre->nfolders = 0;
    pre->folders = NULL;
    pre->chunk_from = pre->slots = NULL;
    pre->by_path = PyDict_New();
    pre->pool.done = NULL;
    pre->root_fd = -1;
    for (pre->nslots = 16; pre->nslots < 2 * count;)
        pre->nslots *= 2;
    pre->entries = PyMem_Calloc(count ? count : 1, sizeof(preload_entry));
    pre->folders = PyMem_Calloc(nfolders ? nfolders : 1, sizeof(preload_folder));
    pre->chunk_from = PyMem_Calloc(nfolders + 1, sizeof(Py_ssize_t));
    pre->slots = PyMem_Calloc(pre->nslots, sizeof(Py_ssize_t));
    if (pre->by_path == NULL || pre->entries == NULL || pre->folders == NULL ||
        pre->chunk_from == NULL || pre->slots == NULL) {
        Py_DECREF(pre);
        return PyErr_NoMemory();
    }
    /* The same pass again (nothing of Python's runs between them: the dicts are as they
       were), the folders cut into chunks of whole folders. */
    Py_ssize_t chunks = 0, in_chunk = 0;
    pos = 0;
    while (PyDict_Next(cache, &pos, &path, &rows) && pre->nfolders < nfolders) {
        if (!listable(path, rows))
            continue;
        Py_ssize_t inner = 0, first = pre->count;
        while (PyDict_Next(rows, &inner, &name, &row)) {
            if (!checkable(name, row) || pre->count == count)
                continue;
            preload_entry *e = &pre->entries[pre->count];
            e->row = Py_NewRef(row);
            e->name = Py_NewRef(name);
            e->folder = pre->nfolders;
            memcpy(e->key, PyBytes_AS_STRING(PyTuple_GET_ITEM(row, 0)), TAIL);
            Py_ssize_t at = slot_of(pre, row);
            while (pre->slots[at] != 0)
                at = (at + 1) & (pre->nslots - 1);
            pre->slots[at] = ++pre->count;
        }
        if (pre->count == first)
            continue;
        Py_ssize_t len = PyBytes_GET_SIZE(path);
        preload_folder *f = &pre->folders[pre->nfolders];
        f->path = PyMem_Malloc(len + 2);
        if (f->path == NULL) {
            Py_DECREF(pre);
            return PyErr_NoMemory();
        }
        if (len == 0)
            strcpy(f->path, ".");
        else {
            memcpy(f->path, PyBytes_AS_STRING(path), len);
            f->path[len] = '\0';
        }
        f->first = first;
        f->count = pre->count - first;
        if (in_chunk == 0)
            pre->chunk_from[chunks++] = pre->nfolders;
        f->chunk = chunks - 1;
        in_chunk += f->count;
        if (in_chunk >= PRELOAD_CHUNK)
            in_chunk = 0;
        PyObject *index = PyLong_FromSsize_t(pre->nfolders++);
        int failed = index == NULL || PyDict_SetItem(pre->by_path, path, index) < 0;
        Py_XDECREF(index);
        if (failed) {
            Py_DECREF(pre);
            return NULL;
        }
    }
    pre->chunk_from[chunks] = pre->nfolders;
    pre->root_fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0); /* (the caller closes its own) */
    if (pre->root_fd < 0) {
        Py_DECREF(pre);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (pool_init(&pre->pool, chunks, preload_chunk) < 0) {
        Py_DECREF(pre);
        return NULL;
    }
    pool_start(&pre->pool, threads);
    return (PyObject *)pre;
}

/* One regular file of the index below the workspace. */
typedef struct {
    Py_ssize_t start;  /* the entry's offset in the index: git's 40 bytes of stat data, then
                          its object id */
    Py_ssize_t rel_at; /* its path relative to the workspace: in the names, NUL-ended */
    Py_ssize_t rel_len;
    int ask;           /* its lstat may vouch for it: not marked, not racy */
    int excluded;      /* not to be taken unread after all (Vouching.exclude) */
    int vouched;       /* (once its chunk is done) its lstat is the stat data recorded */
    unsigned char tail[TAIL]; /* (then) its stat key */
} index_entry;

#define CHUNK 256 /* entries an lstat thread takes at a time */

/* `st` as git's index records it (cache.h's stat_data: each field cut to 32 bits, the mode
   as git makes it of a file), as git_index.stat_data. */
static void
stat_data(const struct stat *st, unsigned char *out)
{
    unsigned int git[10] = {
        (unsigned int)st->st_ctim.tv_sec, (unsigned int)st->st_ctim.tv_nsec,
        (unsigned int)st->st_mtim.tv_sec, (unsigned int)st->st_mtim.tv_nsec,
        (unsigned int)st->st_dev,         (unsigned int)st->st_ino,
        (st->st_mode & S_IXUSR) ? 0100755u : 0100644u,
        (unsigned int)st->st_uid,         (unsigned int)st->st_gid,
        (unsigned int)st->st_size,
    };
    for (int k = 0; k < 10; k++)
        put_be32(out + 4 * k, git[k]);
}

/* A folder of the index (one its paths are in), listed beside the lstat calls. */
typedef struct {
    const char *path;    /* its path relative to the workspace: the first `len` bytes */
    Py_ssize_t len;      /* (0: the workspace) */
    Py_ssize_t chunk;    /* listed with this chunk, before its lstat calls */
    int listed;          /* (once its chunk is done) 1: `names` as of the key below */
    long long ctime_ns, mtime_ns;
    unsigned long long ino, dev;
    char *text, **names; /* (read_names) */
    Py_ssize_t count;
} index_folder;

/* The files git's index vouches for by their lstat (git_index.Vouched): made by index_files,
   read by seeded. The lstat calls run in threads from the moment the entries are known, a
   chunk of CHUNK entries at a time in the index's order, while Python goes on (the rest of
   git_baseline's look, then the walk): the walk, which meets the folders in about the same
   order, waits only for a chunk not done yet, and takes one itself when no thread has. */
typedef struct {
    PyObject_HEAD
    PyObject *body;        /* the index (bytes), whose stat data and ids the entries point at */
    long hash_size;        /* of an object id: 20 or 32 */
    index_entry *entries;  /* in the index's order: by path */
    Py_ssize_t count;
    char *names;           /* their relative paths, NUL-ended */
    PyObject **rels;       /* each one's path (bytes): the key of its entry in a manifest */
    int root_fd;           /* the workspace (a duplicate, owned); -1: nothing is lstat'ed */
    chunk_pool pool;       /* the lstat calls, CHUNK entries a chunk (its lock guards `seen`) */
    int feed_fd;           /* (the feeder's, until it is done) */
    pthread_t feeder;      /* writes the paths to feed_fd (index_files), when `feeding` */
    int feeding;
    int fed;               /* (the feeder's) 1: every path was written */
    int unfed;             /* (atomic) 1: the feeder stops writing (the Vouching is freed) */
    Py_ssize_t names_size; /* bytes of `names` */
    Py_ssize_t candidates; /* entries asked and not excluded */
    index_folder *folders; /* every folder of the entries, in the index's order (by chunk) */
    Py_ssize_t nfolders;
    index_folder **by_path; /* the same, by path */
    unsigned long long *seen; /* (with pool.lock) the folders listed: device and inode, +1 */
    Py_ssize_t seen_size;     /* (pairs: a power of two, twice the folders or more) */
} Vouching;

/* 1: the folder of device `dev` and inode `ino` was not listed yet (it is now taken). */
static int
first_listing(Vouching *v, unsigned long long dev, unsigned long long ino)
{
    Py_ssize_t at = (Py_ssize_t)((ino * 0x9E3779B97F4A7C15ull) ^ dev) & (v->seen_size - 1);
    int first = 1;
    pthread_mutex_lock(&v->pool.lock);
    for (;; at = (at + 1) & (v->seen_size - 1)) {
        unsigned long long *slot = v->seen + 2 * at;
        if (slot[0] == 0) { /* (at most one folder a slot: never full) */
            slot[0] = dev + 1;
            slot[1] = ino;
            break;
        }
        if (slot[0] == dev + 1 && slot[1] == ino) {
            first = 0;
            break;
        }
    }
    pthread_mutex_unlock(&v->pool.lock);
    return first;
}

/* Folder `f` listed as of its change time, modification time and inode (taken before its
   names are read: a name added meanwhile moves them). Opened below the workspace without
   following a link at its own name; one on the way is followed, as fstatat follows it for
   the lstat calls: the walk, which follows none, takes a listing only of the folder it
   opened itself (the same inode and device). */
static void
list_folder(Vouching *v, index_folder *f)
{
    char small[512], *path = f->len < (Py_ssize_t)sizeof(small) ? small : malloc(f->len + 1);
    if (path == NULL)
        return;
    if (f->len == 0)
        strcpy(path, ".");
    else {
        memcpy(path, f->path, f->len);
        path[f->len] = '\0';
    }
    int fd = openat(v->root_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (path != small)
        free(path);
    struct stat st;
    if (fd < 0)
        return;
    /* Each folder listed once, whatever path reaches it: an index may name one by many
       (through links, `./`), each of which would list it again. */
    DIR *dir = fstat(fd, &st) == 0 && first_listing(v, st.st_dev, st.st_ino) ? fdopendir(fd)
                                                                             : NULL;
    if (dir == NULL) {
        close(fd);
        return;
    }
    if (read_names(dir, &f->text, &f->names, &f->count) != 0)
        return;
    f->ctime_ns = (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
    f->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    f->ino = (unsigned long long)st.st_ino;
    f->dev = (unsigned long long)st.st_dev;
    f->listed = 1;
}

static void
do_chunk(chunk_pool *pool, Py_ssize_t c)
{
    Vouching *v = (Vouching *)((char *)pool - offsetof(Vouching, pool));
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(v->body);
    Py_ssize_t lo = 0, hi = v->nfolders; /* (the first folder of chunk `c`) */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (v->folders[mid].chunk < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; v->root_fd >= 0 && lo < v->nfolders && v->folders[lo].chunk == c; lo++)
        list_folder(v, &v->folders[lo]);
    /* Each file by its name in its folder, opened once for its files in the chunk: the
       kernel then resolves one name, not the whole path (a third of an lstat's time). */
    const char *folder = NULL;
    Py_ssize_t folder_len = -1;
    int folder_fd = -1;
    Py_ssize_t to = (c + 1) * CHUNK < v->count ? (c + 1) * CHUNK : v->count;
    for (Py_ssize_t i = c * CHUNK; i < to; i++) {
        index_entry *e = &v->entries[i];
        struct stat st;
        unsigned char now[40];
        if (!e->ask || v->root_fd < 0)
            continue;
        const char *rel = v->names + e->rel_at, *slash = memrchr(rel, '/', e->rel_len);
        Py_ssize_t len = slash != NULL ? slash - rel : 0;
        if (len != folder_len || memcmp(rel, folder, len) != 0) {
            if (folder_fd >= 0)
                close(folder_fd);
            folder_fd = -1;
            if (len > 0 && len < PATH_MAX) {
                char path[PATH_MAX];
                memcpy(path, rel, len);
                path[len] = '\0';
                folder_fd = openat(v->root_fd, path,
                                   O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            }
            folder = rel;
            folder_len = len;
        }
        int at = folder_fd >= 0 ? folder_fd : v->root_fd;
        if (fstatat(at, folder_fd >= 0 ? slash + 1 : rel, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        stat_data(&st, now);
        if (memcmp(now, d + e->start, 40) == 0 && stat_key(&st, e->tail))
            e->vouched = 1;
    }
    if (folder_fd >= 0)
        close(folder_fd);
}

/* Entry `i` with its lstat made. */
static index_entry *
lstat_made(Vouching *v, Py_ssize_t i)
{
    pool_wait(&v->pool, i / CHUNK);
    return &v->entries[i];
}

/* The paths, each NUL-ended, to `feed_fd` (a pipe to `git check-attr -z --stdin`), which
   is then closed: the caller reads what git answers meanwhile. Written without blocking
   for good: a Vouching freed before its caller read git's answer (an index whose checksum
   is wrong) would wait forever for git, which waits for its answer to be read; `unfed`
   stops the writing then. Touches nothing of Python's. */
static void *
feed_paths(void *arg)
{
    Vouching *v = arg;
    int flags = fcntl(v->feed_fd, F_GETFL);
    if (flags >= 0)
        fcntl(v->feed_fd, F_SETFL, flags | O_NONBLOCK);
    for (Py_ssize_t at = 0; at < v->names_size;) {
        if (__atomic_load_n(&v->unfed, __ATOMIC_RELAXED))
            break;
        ssize_t n = write(v->feed_fd, v->names + at, v->names_size - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd out = {v->feed_fd, POLLOUT, 0};
            poll(&out, 1, 50); /* (git reads on, or unfed is looked at again) */
            continue;
        }
        if (n <= 0)
            break; /* (git gone: EPIPE; it failed, and says so) */
        at += n;
        if (at == v->names_size)
            v->fed = 1;
    }
    if (v->names_size == 0)
        v->fed = 1;
    close(v->feed_fd);
    return NULL;
}

static void
feed_joined(Vouching *v)
{
    if (v->feeding) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(v->feeder, NULL);
        Py_END_ALLOW_THREADS
        v->feeding = 0;
    }
}

static PyObject *
Vouching_fed(Vouching *v, PyObject *unused)
{
    feed_joined(v);
    return PyBool_FromLong(v->fed);
}

static void
Vouching_dealloc(Vouching *v)
{
    __atomic_store_n(&v->unfed, 1, __ATOMIC_RELAXED); /* (no one reads git's answer now) */
    feed_joined(v);
    pool_end(&v->pool);
    if (v->root_fd >= 0)
        close(v->root_fd);
    for (Py_ssize_t i = 0; v->rels != NULL && i < v->count; i++)
        Py_XDECREF(v->rels[i]);
    PyMem_Free(v->rels);
    PyMem_Free(v->entries);
    PyMem_Free(v->names);
    for (Py_ssize_t k = 0; v->folders != NULL && k < v->nfolders; k++) {
        free(v->folders[k].names);
        free(v->folders[k].text);
    }
    PyMem_Free(v->folders);
    PyMem_Free(v->by_path);
    PyMem_Free(v->seen);
    Py_XDECREF(v->body);
    Py_TYPE(v)->tp_free((PyObject *)v);
}

/* bytes order (memcmp, then the shorter first), as git sorts its index. */
static int
compare_rel(const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);
    return c != 0 ? c : (an < bn ? -1 : an > bn ? 1 : 0);
}

/* The first entry whose path is not before `key` (`count` when none). */
static Py_ssize_t
lower_bound(Vouching *v, const char *key, Py_ssize_t len)
{
    Py_ssize_t lo = 0, hi = v->count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        index_entry *e = &v->entries[mid];
        if (compare_rel(v->names + e->rel_at, e->rel_len, key, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry of the path `rel` (bytes), -1 for none; -2 with TypeError for one not bytes. */
static Py_ssize_t
find_rel(Vouching *v, PyObject *rel)
{
    if (!PyBytes_Check(rel)) {
        PyErr_SetString(PyExc_TypeError, "a path is bytes");
        return -2;
    }
    Py_ssize_t i = lower_bound(v, PyBytes_AS_STRING(rel), PyBytes_GET_SIZE(rel));
    if (i < v->count && compare_rel(v->names + v->entries[i].rel_at, v->entries[i].rel_len,
                                    PyBytes_AS_STRING(rel), PyBytes_GET_SIZE(rel)) == 0)
        return i;
    return -1;
}

static PyObject *
Vouching_exclude(Vouching *v, PyObject *paths)
{
    PyObject *items = PySequence_Fast(paths, "exclude(paths): an iterable of bytes");
    if (items == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(items); k++) {
        Py_ssize_t i = find_rel(v, PySequence_Fast_GET_ITEM(items, k));
        if (i == -2) {
            Py_DECREF(items);
            return NULL;
        }
        if (i >= 0 && !v->entries[i].excluded) {
            v->entries[i].excluded = 1;
            v->candidates -= v->entries[i].ask;
        }
    }
    Py_DECREF(items);
    Py_RETURN_NONE;
}

static PyObject *
Vouching_recorded_sizes(Vouching *v, PyObject *paths)
{
    PyObject *items = PySequence_Fast(paths, "recorded_sizes(paths): an iterable of bytes");
    PyObject *out = items != NULL ? PyDict_New() : NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(v->body);
    for (Py_ssize_t k = 0; out != NULL && k < PySequence_Fast_GET_SIZE(items); k++) {
        PyObject *path = PySequence_Fast_GET_ITEM(items, k);
        Py_ssize_t i = find_rel(v, path);
        if (i == -2) {
            Py_CLEAR(out);
            break;
        }
        if (i < 0)
            continue;
        PyObject *size = PyLong_FromUnsignedLong(be32(d + v->entries[i].start + 36));
        if (size == NULL || PyDict_SetItem(out, path, size) < 0)
            Py_CLEAR(out);
        Py_XDECREF(size);
    }
    Py_XDECREF(items);
    return out;
}

/* `lead` (`lead_len` bytes of ASCII), then the hex of the object id at `oid`, as a str: a
   blob id, a tree id, `git:` and a blob id (GIT_REF). */
static PyObject *
hex_text(const char *lead, Py_ssize_t lead_len, const unsigned char *oid, long hash_size)
{
    static const char hex[] = "0123456789abcdef";
    PyObject *text = PyUnicode_New(lead_len + 2 * hash_size, 127);
    if (text == NULL)
        return NULL;
    char *out = (char *)PyUnicode_DATA(text) + lead_len;
    memcpy(PyUnicode_DATA(text), lead, lead_len);
    for (long k = 0; k < hash_size; k++) {
        out[2 * k] = hex[oid[k] >> 4];
        out[2 * k + 1] = hex[oid[k] & 15];
    }
    return text;
}

static PyObject *
git_ref_of(const unsigned char *oid, long hash_size)
{
    return hex_text("git:", 4, oid, hash_size);
}

static PyObject *
Vouching_taken(Vouching *v, PyObject *unused)
{
    PyObject *out = PyDict_New();
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(v->body);
    for (Py_ssize_t i = 0; out != NULL && i < v->count; i++) {
        index_entry *e = lstat_made(v, i);
        if (!e->vouched || e->excluded)
            continue;
        PyObject *tail = PyBytes_FromStringAndSize((const char *)e->tail, TAIL);
        PyObject *ref = git_ref_of(d + e->start + 40, v->hash_size);
        PyObject *pair = tail != NULL && ref != NULL ? PyTuple_Pack(2, tail, ref) : NULL;
        if (pair == NULL || PyDict_SetItem(out, v->rels[i], pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(tail);
        Py_XDECREF(ref);
        Py_XDECREF(pair);
    }
    return out;
}

static Py_ssize_t
Vouching_len(Vouching *v)
{
    return v->candidates;
}

static int
Vouching_contains(Vouching *v, PyObject *rel)
{
    Py_ssize_t i = find_rel(v, rel);
    if (i == -2) {
        PyErr_Clear(); /* (not a path: not in it, as a dict says of a key it cannot hold) */
        return 0;
    }
    return i >= 0 && v->entries[i].ask && !v->entries[i].excluded;
}

static int
by_folder_path(const void *a, const void *b)
{
    const index_folder *x = *(index_folder *const *)a, *y = *(index_folder *const *)b;
    return compare_rel(x->path, x->len, y->path, y->len);
}

static PyObject *
Vouching_listing(Vouching *v, PyObject *args)
{
    const char *path;
    Py_ssize_t len;
    long long ctime_ns, mtime_ns, racy_after;
    unsigned long long ino, dev;
    if (!PyArg_ParseTuple(args, "y#LLKKL:listing", &path, &len, &ctime_ns, &mtime_ns, &ino,
                          &dev, &racy_after))
        return NULL;
    Py_ssize_t lo = 0, hi = v->nfolders;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (compare_rel(v->by_path[mid]->path, v->by_path[mid]->len, path, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == v->nfolders ||
        compare_rel(v->by_path[lo]->path, v->by_path[lo]->len, path, len) != 0)
        Py_RETURN_NONE;
    index_folder *f = v->by_path[lo];
    pool_wait(&v->pool, f->chunk);
    /* As the scanner's listings (Scanner._names): of the folder it opened, unchanged since,
       and not changed within the racy margin (a name added in the same clock tick would
       leave its times as they were). */
    if (!f->listed || f->ctime_ns != ctime_ns || f->mtime_ns != mtime_ns || f->ino != ino ||
        f->dev != dev || f->ctime_ns >= racy_after || f->mtime_ns >= racy_after)
        Py_RETURN_NONE;
    return names_list(f->names, f->count);
}

static PyMethodDef Vouching_methods[] = {
    {"fed", (PyCFunction)Vouching_fed, METH_NOARGS,
     "fed() -> True once every path was written to the feed (waits for it)"},
    {"listing", (PyCFunction)Vouching_listing, METH_VARARGS,
     "listing(path, ctime_ns, mtime_ns, ino, dev, racy_after) -> the folder's names, sorted, "
     "as listed beside the lstat calls; None where that listing cannot stand"},
    {"exclude", (PyCFunction)Vouching_exclude, METH_O,
     "exclude(paths): not to be taken unread after all"},
    {"recorded_sizes", (PyCFunction)Vouching_recorded_sizes, METH_O,
     "recorded_sizes(paths) -> {path: the size git's index recorded (32 bits)}"},
    {"taken", (PyCFunction)Vouching_taken, METH_NOARGS,
     "taken() -> {path: (stat key, git: id)} of every file vouched for (waits for all)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Vouching_as_sequence = {
    .sq_length = (lenfunc)Vouching_len,
    .sq_contains = (objobjproc)Vouching_contains,
};

static PyTypeObject VouchingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "durable_agent.workspace._speedups.Vouching",
    .tp_basicsize = sizeof(Vouching),
    .tp_dealloc = (destructor)Vouching_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The files git's index vouches for by their lstat, made in threads "
              "(index_files): len() the entries that may be, `in` one that may be.",
    .tp_methods = Vouching_methods,
    .tp_as_sequence = &Vouching_as_sequence,
};

static PyObject *
bad_index(const char *why)
{
    PyErr_SetString(PyExc_ValueError, why);
    return NULL;
}

/* The object id of the whole tree git's cache-tree extension (TREE, `size` bytes at `p`)
   records, into `oid`: 1; 0 where it records none (not valid: git writes -1 entries). */
static int
tree_root(const unsigned char *p, Py_ssize_t size, long hash_size, unsigned char *oid)
{
    Py_ssize_t i = 1, digits = 0;
    int negative = 0;
    if (size < 1 || p[0] != 0) /* (the root's path: empty) */
        return 0;
    if (i < size && p[i] == '-') {
        negative = 1;
        i++;
    }
    for (; i < size && p[i] >= '0' && p[i] <= '9'; i++)
        digits++;
    if (!digits || i >= size || p[i] != ' ')
        return 0;
    for (i++, digits = 0; i < size && p[i] >= '0' && p[i] <= '9'; i++)
        digits++;
    if (!digits || i >= size || p[i] != '\n')
        return 0;
    i++;
    if (negative || i + hash_size > size)
        return 0;
    memcpy(oid, p + i, hash_size);
    return 1;
}

/* The entries of the index `d` (`n` bytes, no checksum): the regular files below `lead`
   into `*out` (`*count` of them), their relative paths into `*names`, NUL-ended. 1: read;
   0: an index this does not read (a merge's stages, an intent-to-add, a split or sparse
   index, paths out of order or twice); -1: damaged, ValueError set. Nothing of Python's is
   made but memory. */
static int
parse_index(const unsigned char *d, Py_ssize_t n, long hash_size, const char *lead,
            Py_ssize_t lead_len, long long racy_from, index_entry **out, Py_ssize_t *count,
            char **names, Py_ssize_t *names_size, unsigned char *tree, int *has_tree)
{
    *has_tree = 0;
    *out = NULL;
    *names = NULL;
    *count = 0;
    if (n < 12 || memcmp(d, "DIRC", 4) != 0)
        return bad_index("not a git index of version 2, 3 or 4"), -1;
    unsigned int version = be32(d + 4), listed = be32(d + 8);
    if (version < 2 || version > 4)
        return bad_index("not a git index of version 2, 3 or 4"), -1;
    Py_ssize_t fixed = 40 + hash_size, pos = 12;
    /* (no more entries than the bytes hold, whatever the count says) */
    Py_ssize_t most = (Py_ssize_t)listed < n / (fixed + 3) ? (Py_ssize_t)listed : n / (fixed + 3);
    index_entry *entries = PyMem_Malloc((most ? most : 1) * sizeof(index_entry));
    Py_ssize_t names_cap = n + 1, names_len = 0;
    char *text = PyMem_Malloc(names_cap);
    char *previous = NULL; /* version 4: the previous path */
    Py_ssize_t previous_len = 0, previous_cap = 0, found = 0;
    const char *last = NULL; /* versions 2 and 3: the previous path */
    Py_ssize_t last_len = 0;
    int result = -1;
    if (entries == NULL || text == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (unsigned int i = 0; i < listed; i++) {
        Py_ssize_t start = pos;
        if (pos + fixed + 2 > n) {
            bad_index("an entry past the end of the index");
            goto done;
        }
        unsigned int flags = be16(d + pos + fixed), extended = 0;
        Py_ssize_t name_at = pos + fixed + 2;
        if (flags & 0x4000) {
            if (version < 3) {
                bad_index("extended flags in a version 2 index");
                goto done;
            }
            if (name_at + 2 > n) {
                bad_index("an entry past the end of the index");
                goto done;
            }
            extended = be16(d + name_at);
            name_at += 2;
        }
        const char *path;
        Py_ssize_t path_len;
        if (version == 4) { /* the previous name, less N bytes, plus a suffix (varint.c) */
            if (name_at >= n) {
                bad_index("an entry past the end of the index");
                goto done;
            }
            unsigned char byte = d[name_at++];
            unsigned long long strip = byte & 0x7f;
            while (byte & 0x80) {
                if (name_at >= n || strip > ((unsigned long long)1 << 40)) {
                    bad_index("an entry past the end of the index");
                    goto done;
                }
                byte = d[name_at++];
                strip = ((strip + 1) << 7) | (byte & 0x7f);
            }
            const unsigned char *end = memchr(d + name_at, 0, n - name_at);
            if (end == NULL) {
                bad_index("a name past the end of the index");
                goto done;
            }
            if (strip > (unsigned long long)previous_len) {
                bad_index("a prefix longer than the previous name");
                goto done;
            }
            Py_ssize_t suffix = end - (d + name_at);
            Py_ssize_t keep = previous_len - (Py_ssize_t)strip;
            if (i > 0 && compare_rel(previous + keep, previous_len - keep,
                                     (const char *)d + name_at, suffix) >= 0) {
                result = 0; /* out of order (see below) */
                goto done;
            }
            if (keep + suffix + 1 > previous_cap) {
                Py_ssize_t cap = (keep + suffix + 1) * 2;
                char *grown = PyMem_Realloc(previous, cap);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                previous = grown;
                previous_cap = cap;
            }
            memcpy(previous + keep, d + name_at, suffix);
            previous_len = keep + suffix;
            path = previous;
            path_len = previous_len;
            pos = (end - d) + 1;
        }
        else {
            const unsigned char *end = memchr(d + name_at, 0, n - name_at);
            if (end == NULL) {
                bad_index("a name past the end of the index");
                goto done;
            }
            path = (const char *)d + name_at;
            path_len = end - (d + name_at);
            /* Each path after the one before, as git writes them: in an index out of
               order a folder's paths are apart, and each return to it lists it again. */
            if (i > 0 && compare_rel(last, last_len, path, path_len) >= 0) {
                result = 0;
                goto done;
            }
            last = path;
            last_len = path_len;
            pos += (name_at - pos + path_len + 8) & ~(Py_ssize_t)7; /* 1 to 8 NULs pad */
        }
        unsigned int mode = be32(d + start + 24);
        if ((flags & 0x3000) || (extended & 0x2000) || mode == 040000) {
            result = 0; /* a merge's stages, an intent-to-add, a sparse directory */
            goto done;
        }
        if ((mode != 0100644 && mode != 0100755) || path_len < lead_len ||
            memcmp(path, lead, lead_len) != 0)
            continue;
        Py_ssize_t rel_len = path_len - lead_len;
        if (found == most) { /* (cannot be: each entry takes fixed + 3 bytes or more) */
            bad_index("more entries than the index holds");
            goto done;
        }
        if (names_len + rel_len + 1 > names_cap) { /* (version 4's names share prefixes) */
            Py_ssize_t cap = (names_len + rel_len + 1) * 2;
            char *grown = PyMem_Realloc(text, cap);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            text = grown;
            names_cap = cap;
        }
        index_entry *e = &entries[found++];
        e->start = start;
        e->rel_at = names_len;
        e->rel_len = rel_len;
        memcpy(text + names_len, path + lead_len, rel_len);
        text[names_len + rel_len] = '\0';
        names_len += rel_len + 1;
        long long c = (long long)be32(d + start) * 1000000000LL + be32(d + start + 4);
        long long m = (long long)be32(d + start + 8) * 1000000000LL + be32(d + start + 12);
        /* Marked assume-unchanged or skip-worktree, or racy: never vouched for by an lstat. */
        e->ask = !(flags & 0x8000) && !(extended & 0x4000) && c < racy_from && m < racy_from;
        e->vouched = 0;
        e->excluded = 0;
    }
    while (pos < n) { /* the extensions */
        if (pos + 8 > n) {
            bad_index("an extension past the end of the index");
            goto done;
        }
        if (memcmp(d + pos, "link", 4) == 0 || memcmp(d + pos, "sdir", 4) == 0) {
            result = 0; /* a split index; sparse directories */
            goto done;
        }
        Py_ssize_t size = (Py_ssize_t)be32(d + pos + 4);
        if (memcmp(d + pos, "TREE", 4) == 0 && !*has_tree && pos + 8 + size <= n)
            *has_tree = tree_root(d + pos + 8, size, hash_size, tree);
        pos += 8 + size;
    }
    if (pos != n) {
        bad_index("an extension past the end of the index");
        goto done;
    }
    result = 1;
done:
    PyMem_Free(previous);
    if (result == 1) {
        *out = entries;
        *names = text;
        *names_size = names_len;
        *count = found;
    }
    else {
        PyMem_Free(entries);
        PyMem_Free(text);
    }
    return result;
}

/* index_files(body, hash_size, lead, racy_from, root_fd, threads, feed_fd) -> (files,
   vouching, tree) or None, as git_index._index_files_py: `body` is the index without its
   checksum; `files` path -> blob id; `vouching` a Vouching, whose lstat calls (none when
   `root_fd` is -1) run in `threads` threads from now on; `tree` the id of the whole tree
   the index's cache-tree records, None where it records none. `feed_fd` (-1: none) is
   written the paths, each NUL-ended, by a thread of its own, and closed, whatever the
   answer: the input of `git check-attr -z --stdin`, which starts on them as soon as they
   are known. */
static PyObject *index_files_fed(PyObject *const *args, Py_ssize_t nargs, int feed_fd, int *fed);

static PyObject *
index_files(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long feed_fd = nargs == 7 ? PyLong_AsLong(args[6]) : -1;
    if (feed_fd == -1 && PyErr_Occurred())
        return NULL;
    if (feed_fd < -1 || feed_fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return NULL;
    }
    int fed = 0;
    PyObject *out = index_files_fed(args, nargs, (int)feed_fd, &fed);
    if (feed_fd >= 0 && !fed)
        close((int)feed_fd); /* (else the feeder closes it) */
    return out;
}

/* index_files, but `feed_fd`, which is the caller's unless a feeder took it (`*fed`). */
static PyObject *
index_files_fed(PyObject *const *args, Py_ssize_t nargs, int feed_fd, int *fed)
{
    if (nargs != 7 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "index_files(body, hash_size, lead, racy_from, "
                                         "root_fd, threads, feed_fd)");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    long hash_size = PyLong_AsLong(args[1]);
    if (hash_size == -1 && PyErr_Occurred())
        return NULL;
    if (hash_size != 20 && hash_size != 32)
        return bad_index("an object id of 20 or 32 bytes");
    long long racy_from = PyLong_AsLongLong(args[3]);
    if (racy_from == -1 && PyErr_Occurred())
        return NULL;
    long root_fd = PyLong_AsLong(args[4]), threads = PyLong_AsLong(args[5]);
    if ((root_fd == -1 || threads == -1) && PyErr_Occurred())
        return NULL;
    if (root_fd < -1 || root_fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return NULL;
    }
    index_entry *entries;
    Py_ssize_t count;
    char *names;
    Py_ssize_t names_size = 0;
    unsigned char tree[32];
    int has_tree;
    int read = parse_index(d, PyBytes_GET_SIZE(args[0]), hash_size, PyBytes_AS_STRING(args[2]),
                           PyBytes_GET_SIZE(args[2]), racy_from, &entries, &count, &names,
                           &names_size, tree, &has_tree);
    if (read <= 0)
        return read == 0 ? Py_NewRef(Py_None) : NULL;
    Vouching *v = PyObject_New(Vouching, &VouchingType);
    if (v == NULL) {
        PyMem_Free(entries);
        PyMem_Free(names);
        return NULL;
    }
    v->body = Py_NewRef(args[0]);
    v->hash_size = hash_size;
    v->entries = entries;
    v->count = count;
    v->names = names;
    v->rels = NULL;
    v->root_fd = -1;
    v->pool.done = NULL;
    v->feeding = 0;
    v->fed = 0;
    v->unfed = 0;
    v->feed_fd = -1;
    v->names_size = names_size;
    v->candidates = 0;
    v->folders = NULL;
    v->by_path = NULL;
    v->seen = NULL;
    v->nfolders = 0;
    if (pool_init(&v->pool, (count + CHUNK - 1) / CHUNK, do_chunk) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        v->candidates += entries[i].ask;
    /* The folders, in the order the entries enter them: each path's folders that the path
       before it is not in (a folder's paths are together in the index). */
    Py_ssize_t folders_cap = 64;
    v->folders = PyMem_Calloc(folders_cap, sizeof(index_folder));
    if (v->folders == NULL) {
        Py_DECREF(v);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *cur = names + entries[i].rel_at, *prev = "";
        Py_ssize_t cur_len = entries[i].rel_len, prev_len = 0, common = 0;
        if (i > 0) {
            prev = names + entries[i - 1].rel_at;
            prev_len = entries[i - 1].rel_len;
        }
        while (common < cur_len && common < prev_len && cur[common] == prev[common])
            common++;
        for (Py_ssize_t p = i == 0 ? -1 : common; p < cur_len; p++) {
            if (p >= 0 && cur[p] != '/')
                continue; /* (-1: the workspace itself, entered by the first path) */
            if (v->nfolders == folders_cap) {
                index_folder *more =
                    PyMem_Realloc(v->folders, 2 * folders_cap * sizeof(index_folder));
                if (more == NULL) {
                    Py_DECREF(v);
                    return PyErr_NoMemory();
                }
                memset(more + folders_cap, 0, folders_cap * sizeof(index_folder));
                v->folders = more;
                folders_cap *= 2;
            }
            v->folders[v->nfolders++] = (index_folder){cur, p < 0 ? 0 : p, i / CHUNK};
        }
    }
    v->by_path = PyMem_Calloc(v->nfolders ? v->nfolders : 1, sizeof(index_folder *));
    if (v->by_path == NULL) {
        Py_DECREF(v);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < v->nfolders; k++)
        v->by_path[k] = &v->folders[k];
    qsort(v->by_path, v->nfolders, sizeof(index_folder *), by_folder_path);
    for (v->seen_size = 1; v->seen_size < 2 * v->nfolders;)
        v->seen_size *= 2;
    v->seen = PyMem_Calloc(v->seen_size, 2 * sizeof(unsigned long long));
    if (v->seen == NULL) {
        Py_DECREF(v);
        return PyErr_NoMemory();
    }
    if (root_fd >= 0) {
        v->root_fd = fcntl((int)root_fd, F_DUPFD_CLOEXEC, 0); /* (the caller closes its own) */
        if (v->root_fd < 0) {
            Py_DECREF(v);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    else {
        v->candidates = 0; /* nothing lstat'ed: none vouched for, none asked */
        for (Py_ssize_t i = 0; i < count; i++)
            entries[i].ask = 0;
    }
    if (feed_fd >= 0) {
        v->feed_fd = feed_fd;
        int failed = pthread_create(&v->feeder, NULL, feed_paths, v);
        if (failed) {
            Py_DECREF(v);
            errno = failed;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        v->feeding = *fed = 1;
    }
    if (v->root_fd >= 0)
        pool_start(&v->pool, threads);
    PyObject *files = _PyDict_NewPresized(count), *out = NULL;
    v->rels = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    int failed = v->rels == NULL || files == NULL;
    if (v->rels == NULL)
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        index_entry *e = &entries[i];
        v->rels[i] = PyBytes_FromStringAndSize(names + e->rel_at, e->rel_len);
        PyObject *blob = v->rels[i] ? hex_text("", 0, d + e->start + 40, hash_size) : NULL;
        failed = blob == NULL || PyDict_SetItem(files, v->rels[i], blob) < 0;
        Py_XDECREF(blob);
    }
    if (!failed) {
        PyObject *root = has_tree ? hex_text("", 0, tree, hash_size) : Py_NewRef(Py_None);
        out = root != NULL ? PyTuple_Pack(3, files, (PyObject *)v, root) : NULL;
        Py_XDECREF(root);
    }
    Py_XDECREF(files);
    Py_DECREF(v);
    return out;
}

/* -- a fresh scanner's folder, on git's word (scan.py, _seeded_py) ------------------------ */

/* 1: `name` may be a secret's by its name (secrets.NAME_SHAPES: prefixes, suffixes, whole
   names, in lower case); such a name is left to the caller, which decides. */
static int
may_be_secret(const char *name, Py_ssize_t len, PyObject *shapes)
{
    if (shapes == Py_None)
        return 0;
    char low[256];
    if (len >= (Py_ssize_t)sizeof(low))
        return 1;
    for (Py_ssize_t i = 0; i < len; i++) {
        char c = name[i];
        low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    for (int kind = 0; kind < 3; kind++) {
        PyObject *each = PyTuple_GET_ITEM(shapes, kind);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(each); k++) {
            PyObject *shape = PyTuple_GET_ITEM(each, k);
            Py_ssize_t n = PyBytes_GET_SIZE(shape);
            const char *s = PyBytes_AS_STRING(shape);
            if (n > len)
                continue;
            if ((kind == 0 && memcmp(low, s, n) == 0) ||
                (kind == 1 && memcmp(low + len - n, s, n) == 0) ||
                (kind == 2 && n == len && memcmp(low, s, n) == 0))
                return 1;
        }
    }
    return 0;
}

static int
valid_shapes(PyObject *shapes)
{
    if (shapes == Py_None)
        return 1;
    if (!PyTuple_Check(shapes) || PyTuple_GET_SIZE(shapes) != 3)
        return 0;
    for (int kind = 0; kind < 3; kind++) {
        PyObject *each = PyTuple_GET_ITEM(shapes, kind);
        if (!PyTuple_Check(each))
            return 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(each); k++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(each, k)))
                return 0;
    }
    return 1;
}

/* The entry of the next path at or after entry `i` that is in the folder `lead` itself (not
   below a folder in it), `count` when none: git's index holds a folder's paths together,
   its own files in order among those of its folders, which are skipped whole. */
static Py_ssize_t
next_in_folder(Vouching *v, Py_ssize_t i, const char *lead, Py_ssize_t lead_len)
{
    while (i < v->count) {
        index_entry *e = &v->entries[i];
        const char *rel = v->names + e->rel_at;
        if (e->rel_len <= lead_len || memcmp(rel, lead, lead_len) != 0)
            return v->count; /* past the folder */
        const char *slash = memchr(rel + lead_len, '/', e->rel_len - lead_len);
        if (slash == NULL)
            return i;
        /* A folder's paths: past all of them, to the first not before its name and a `0`
           (the byte after `/`). */
        Py_ssize_t len = slash - rel + 1;
        char *key = PyMem_Malloc(len);
        if (key == NULL)
            return -1;
        memcpy(key, rel, len);
        key[len - 1] = '0';
        Py_ssize_t past = lower_bound(v, key, len);
        PyMem_Free(key);
        i = past > i ? past : i + 1; /* (an index out of order: one at a time) */
    }
    return v->count;
}

static PyObject *mode_ints[01000]; /* permission bits as ints, made once */

/* seeded(names, lead, vouching, cached, entries, entry, kind, size_cap, racy_after, shapes)
   -> the names left to the caller, as scan._seeded_py. `names` in order (as listed): the
   folder's own entries of the index are met in the same order. */
static PyObject *
seeded(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "seeded() takes 10 arguments");
        return NULL;
    }
    PyObject *names = args[0], *lead = args[1], *cached = args[3], *entries = args[4];
    PyObject *entry_type = args[5], *kind = args[6], *shapes = args[9];
    if (!PyList_Check(names) || !PyBytes_Check(lead) || !Py_IS_TYPE(args[2], &VouchingType) ||
        !PyDict_Check(cached) || !PyDict_Check(entries) || !valid_shapes(shapes)) {
        PyErr_SetString(PyExc_TypeError,
                        "seeded(): a list, bytes, a Vouching, two dicts, ..., shapes");
        return NULL;
    }
    Vouching *v = (Vouching *)args[2];
    long long size_cap = PyLong_AsLongLong(args[7]);
    if (size_cap == -1 && PyErr_Occurred())
        return NULL;
    long long racy_after = PyLong_AsLongLong(args[8]);
    if (racy_after == -1 && PyErr_Occurred())
        return NULL;
    Py_INCREF(v);
    Py_INCREF(lead); /* (ours while the GIL is let go, as the walk's lists are) */
    const char *lead_s = PyBytes_AS_STRING(lead);
    Py_ssize_t lead_len = PyBytes_GET_SIZE(lead);
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(v->body);
    PyObject *todo = PyList_New(0), *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (todo == NULL || empty == NULL)
        goto fail;
    Py_ssize_t first = lower_bound(v, lead_s, lead_len), at = first;
    PyObject *before = NULL; /* the name before (borrowed from `names`' copy) */
    PyObject *listed = PyList_GetSlice(names, 0, PyList_GET_SIZE(names)); /* (ours alone) */
    if (listed == NULL)
        goto fail;
    for (Py_ssize_t n = 0; n < PyList_GET_SIZE(listed); n++) {
        PyObject *name = PyList_GET_ITEM(listed, n), *entry = NULL;
        int taken = 0;
        if (!PyBytes_Check(name) || v->candidates == 0 ||
            may_be_secret(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), shapes))
            goto next;
        const char *s = PyBytes_AS_STRING(name);
        Py_ssize_t len = PyBytes_GET_SIZE(name);
        if (before != NULL && compare_rel(s, len, PyBytes_AS_STRING(before),
                                          PyBytes_GET_SIZE(before)) < 0)
            at = first; /* (names out of order: from the folder's start again) */
        before = name;
        int c = 1;
        while ((at = next_in_folder(v, at, lead_s, lead_len)) >= 0 && at < v->count) {
            index_entry *e = &v->entries[at];
            c = compare_rel(v->names + e->rel_at + lead_len, e->rel_len - lead_len, s, len);
            if (c >= 0)
                break;
            at++;
        }
        if (at < 0) {
            PyErr_NoMemory();
            Py_DECREF(listed);
            goto fail;
        }
        if (at >= v->count || c != 0 || !v->entries[at].ask || v->entries[at].excluded)
            goto next;
        index_entry *e = lstat_made(v, at);
        if (!e->vouched || e->excluded)
            goto next;
        long long ctime_ns, st_size;
        unsigned int st_mode;
        memcpy(&ctime_ns, e->tail, 8);
        memcpy(&st_size, e->tail + 8, 8);
        memcpy(&st_mode, e->tail + 24, 4);
        if (st_size > size_cap)
            goto next;
        st_mode &= 0777;
        if (mode_ints[st_mode] == NULL)
            mode_ints[st_mode] = PyLong_FromLong(st_mode); /* (kept for good) */
        PyObject *ref = git_ref_of(d + e->start + 40, v->hash_size);
        PyObject *size = PyLong_FromLongLong(st_size);
        if (ref != NULL && size != NULL && mode_ints[st_mode] != NULL) {
            PyObject *fields[5] = {kind, mode_ints[st_mode], ref, empty, size};
            entry = PyObject_Vectorcall(entry_type, fields, 5, NULL);
        }
        Py_XDECREF(ref);
        Py_XDECREF(size);
        if (entry == NULL) {
            Py_DECREF(listed);
            goto fail;
        }
        /* The stat cache's row: the lstat's stat key, None while racy (read again by the
           next scan). Of bytes, None and an Entry (a Struct the collector does not track):
           no cycle can go through it, so the collector need not walk it. */
        PyObject *key = ctime_ns >= racy_after
                            ? Py_NewRef(Py_None)
                            : PyBytes_FromStringAndSize((const char *)e->tail, TAIL);
        PyObject *row = key != NULL ? PyTuple_Pack(2, key, entry) : NULL;
        Py_XDECREF(key);
        if (row != NULL && !PyObject_IS_GC(entry))
            PyObject_GC_UnTrack(row);
        int failed = row == NULL || PyDict_SetItem(cached, name, row) < 0 ||
                     PyDict_SetItem(entries, v->rels[at], entry) < 0;
        Py_XDECREF(row);
        Py_DECREF(entry);
        if (failed) {
            Py_DECREF(listed);
            goto fail;
        }
        taken = 1;
        at++;
    next:
        if (!taken && PyList_Append(todo, name) < 0) {
            Py_DECREF(listed);
            goto fail;
        }
    }
    Py_DECREF(listed);
    Py_DECREF(empty);
    Py_DECREF(lead);
    Py_DECREF(v);
    return todo;
fail:
    Py_XDECREF(todo);
    Py_XDECREF(empty);
    Py_DECREF(lead);
    Py_DECREF(v);
    return NULL;
}

/* -- a tree id's buckets and lines (manifest.py, TreeIds: _bucketed_py, _joined_py) ------- */

#define BUCKETS 1024 /* manifest.BUCKETS */

static unsigned int crc_table[256];

static void
make_crc_table(void) /* zlib's crc32 (IEEE 802.3, reflected) */
{
    for (unsigned int n = 0; n < 256; n++) {
        unsigned int c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static unsigned int
crc32_of(const unsigned char *p, Py_ssize_t n)
{
    unsigned int c = 0xFFFFFFFFu;
    while (n-- > 0)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* bucketed(paths) -> BUCKETS lists, each the paths (in their order) whose
   zlib.crc32(path) % BUCKETS is its number. */
static PyObject *
bucketed(PyObject *module, PyObject *paths)
{
    if (!PyList_Check(paths)) {
        PyErr_SetString(PyExc_TypeError, "bucketed(list of bytes)");
        return NULL;
    }
    PyObject *out = PyList_New(BUCKETS);
    if (out == NULL)
        return NULL;
    for (int b = 0; b < BUCKETS; b++) {
        PyObject *each = PyList_New(0);
        if (each == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, b, each);
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "bucketed(list of bytes)");
            Py_DECREF(out);
            return NULL;
        }
        unsigned int b = crc32_of((const unsigned char *)PyBytes_AS_STRING(path),
                                  PyBytes_GET_SIZE(path)) % BUCKETS;
        if (PyList_Append(PyList_GET_ITEM(out, b), path) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} buffer;

static int
put(buffer *buf, const char *s, Py_ssize_t n)
{
    if (n == 0) /* (no memcpy to a buffer not yet allocated: undefined even of 0 bytes) */
        return 0;
    if (buf->len + n > buf->cap) {
        Py_ssize_t cap = (buf->len + n) * 2 + 256;
        char *grown = PyMem_Realloc(buf->data, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        buf->data = grown;
        buf->cap = cap;
    }
    memcpy(buf->data + buf->len, s, n);
    buf->len += n;
    return 0;
}

/* `text` as UTF-8 (a str: kind, ref), then a NUL. */
static int
put_text(buffer *buf, PyObject *text)
{
    Py_ssize_t n;
    const char *s = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "an entry's kind and ref are str");
        return -1;
    }
    return put(buf, s, n) < 0 || put(buf, "\0", 1) < 0 ? -1 : 0;
}

/* An int as Python's b"%o" or b"%d" writes it (`octal` or not), then `end`. */
static int
put_int(buffer *buf, PyObject *value, int octal, char end)
{
    if (!PyLong_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "an entry's mode and size are int");
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()) || v == LLONG_MIN) {
        if (!PyErr_Occurred()) /* (the caller takes the Python twin) */
            PyErr_SetString(PyExc_OverflowError, "an entry's mode or size past 64 bits");
        return -1;
    }
    char text[32], *end_at = text + sizeof(text), *p = end_at; /* digits from the right */
    unsigned long long u = (unsigned long long)(v < 0 ? -v : v);
    unsigned int base = octal ? 8 : 10;
    *--p = end;
    do {
        *--p = (char)('0' + u % base);
        u /= base;
    } while (u);
    if (v < 0)
        *--p = '-';
    return put(buf, p, end_at - p);
}

static PyObject *s_kind, *s_mode, *s_ref, *s_target, *s_size;

/* An entry's five fields (kind, mode, ref, target, size) as new references. A msgspec
   Struct keeps its fields in slots: their offsets are read once per type from its member
   descriptors (an attribute lookup each cost as much as the rest of the line). */
static PyTypeObject *slots_of; /* the type the offsets are of (a strong reference) */
static Py_ssize_t slot_at[5];

static int
fields_of(PyObject *entry, PyObject **out)
{
    PyObject *names[5] = {s_kind, s_mode, s_ref, s_target, s_size};
    PyTypeObject *type = Py_TYPE(entry);
    if (type != slots_of) {
        Py_ssize_t at[5];
        int ok = 1;
        for (int k = 0; k < 5 && ok; k++) {
            PyObject *d = PyObject_GetAttr((PyObject *)type, names[k]); /* (the descriptor) */
            ok = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
            if (ok)
                at[k] = ((PyMemberDescrObject *)d)->d_member->offset;
            if (d == NULL)
                PyErr_Clear(); /* (read by name below, which says what is missing) */
            Py_XDECREF(d);
        }
        if (ok) {
            Py_INCREF(type);
            Py_XSETREF(slots_of, type);
            memcpy(slot_at, at, sizeof(at));
        }
    }
    for (int k = 0; k < 5; k++) {
        out[k] = NULL;
        if (type == slots_of) {
            out[k] = *(PyObject **)((char *)entry + slot_at[k]);
            Py_XINCREF(out[k]);
        }
        if (out[k] == NULL)
            out[k] = PyObject_GetAttr(entry, names[k]);
        if (out[k] == NULL) {
            for (int j = 0; j < k; j++)
                Py_DECREF(out[j]);
            return -1;
        }
    }
    return 0;
}

/* The fields of the entry of `path` in `manifest` (new references); -1 with the exception
   set (a KeyError: no such path). */
static int
fields_at(PyObject *manifest, PyObject *path, PyObject **f)
{
    PyObject *entry = PyBytes_Check(path) ? PyDict_GetItemWithError(manifest, path) : NULL;
    if (entry == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, path);
        return -1;
    }
    Py_INCREF(entry);
    int got = fields_of(entry, f);
    Py_DECREF(entry);
    return got;
}

/* The line of `path` in `manifest` (manifest._line): path NUL kind NUL mode (octal) NUL ref
   NUL target NUL size (decimal) LF. */
static int
put_line(buffer *buf, PyObject *manifest, PyObject *path)
{
    PyObject *f[5];
    if (fields_at(manifest, path, f) < 0)
        return -1;
    PyObject *kind = f[0], *mode = f[1], *ref = f[2], *target = f[3], *size = f[4];
    int failed = !PyBytes_Check(target) ||
                 put(buf, PyBytes_AS_STRING(path), PyBytes_GET_SIZE(path)) < 0 ||
                 put(buf, "\0", 1) < 0 || put_text(buf, kind) < 0 ||
                 put_int(buf, mode, 1, '\0') < 0 || put_text(buf, ref) < 0 ||
                 put(buf, PyBytes_AS_STRING(target), PyBytes_GET_SIZE(target)) < 0 ||
                 put(buf, "\0", 1) < 0 || put_int(buf, size, 0, '\n') < 0;
    if (failed && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "an entry's target is bytes");
    for (int k = 0; k < 5; k++)
        Py_DECREF(f[k]);
    return failed ? -1 : 0;
}

/* joined(paths, manifest) -> the lines of `paths` in `manifest`, joined. */
static PyObject *
joined(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "joined(list of paths, manifest)");
        return NULL;
    }
    PyObject *paths = args[0], *manifest = args[1];
    buffer buf = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        Py_INCREF(path);
        int failed = put_line(&buf, manifest, path) < 0;
        Py_DECREF(path);
        if (failed) {
            PyMem_Free(buf.data);
            return NULL;
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(buf.data ? buf.data : "", buf.len);
    PyMem_Free(buf.data);
    return out;
}

/* bucket_lines(paths, manifest) -> BUCKETS bytes: each the lines (put_line) of the `paths`
   in that bucket (bucketed), in their order. The same as joined() of each of bucketed()'s
   lists, made in one pass over `paths`: in sorted order the entries are met in about the
   order they were made, where a bucket's paths are scattered over the heap (at 50,000
   files joined() bucket by bucket waited on memory three times as long). */
static PyObject *
bucket_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bucket_lines(list of paths, manifest)");
        return NULL;
    }
    PyObject *paths = args[0], *manifest = args[1], *out = NULL;
    buffer *bufs = PyMem_Calloc(BUCKETS, sizeof(buffer));
    if (bufs == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths); i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "bucket_lines(list of bytes, manifest)");
            goto done;
        }
        unsigned int b = crc32_of((const unsigned char *)PyBytes_AS_STRING(path),
                                  PyBytes_GET_SIZE(path)) % BUCKETS;
        Py_INCREF(path);
        int failed = put_line(&bufs[b], manifest, path) < 0;
        Py_DECREF(path);
        if (failed)
            goto done;
    }
    out = PyList_New(BUCKETS);
    for (int b = 0; b < BUCKETS && out != NULL; b++) {
        PyObject *lines = PyBytes_FromStringAndSize(bufs[b].data ? bufs[b].data : "", bufs[b].len);
        if (lines == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, b, lines);
    }
done:
    for (int b = 0; b < BUCKETS; b++)
        PyMem_Free(bufs[b].data);
    PyMem_Free(bufs);
    return out;
}

/* -- a whole manifest's stored rows (manifest.py, encode_full) ------------------------------ */

/* `s` as a JSON string's text needing no escape (printable ASCII but `"` and `\`). */
static int
plain(const char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\')
            return 0;
    }
    return 1;
}

static int
put_json_text(buffer *buf, const char *s, Py_ssize_t n, char end)
{
    return put(buf, "\"", 1) < 0 || put(buf, s, n) < 0 || put(buf, "\"", 1) < 0 ||
                   put(buf, &end, 1) < 0
               ? -1
               : 0;
}

/* json_rows(paths, manifest) -> the JSON array of encode_full's rows, [path, kind, mode,
   ref, target, size] each, as msgspec writes it; None where a text is not plain (printable
   ASCII but `"` and `\`) or a number past 64 bits: encode_full's own way then. */
static PyObject *
json_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "json_rows(list of paths, manifest)");
        return NULL;
    }
    PyObject *paths = args[0], *manifest = args[1];
    buffer buf = {NULL, 0, 0};
    int other = 0; /* a row this does not write */
    if (put(&buf, "[", 1) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(paths) && !other; i++) {
        PyObject *path = PyList_GET_ITEM(paths, i), *f[5];
        Py_INCREF(path);
        int failed = fields_at(manifest, path, f) < 0;
        if (!failed) {
            PyObject *kind = f[0], *mode = f[1], *ref = f[2], *target = f[3], *size = f[4];
            Py_ssize_t kn = 0, rn = 0;
            const char *k = PyUnicode_Check(kind) && PyUnicode_IS_ASCII(kind)
                                ? PyUnicode_AsUTF8AndSize(kind, &kn)
                                : NULL;
            const char *r = PyUnicode_Check(ref) && PyUnicode_IS_ASCII(ref)
                                ? PyUnicode_AsUTF8AndSize(ref, &rn)
                                : NULL;
            if (k == NULL || r == NULL || !PyBytes_Check(target) || !PyLong_CheckExact(mode) ||
                !PyLong_CheckExact(size) ||
                !plain(PyBytes_AS_STRING(path), PyBytes_GET_SIZE(path)) || !plain(k, kn) ||
                !plain(r, rn) || !plain(PyBytes_AS_STRING(target), PyBytes_GET_SIZE(target)))
                other = 1;
            else {
                int overflow = 0;
                long long m = PyLong_AsLongLongAndOverflow(mode, &overflow);
                long long z = overflow ? 0 : PyLong_AsLongLongAndOverflow(size, &overflow);
                if (overflow || m == LLONG_MIN || z == LLONG_MIN)
                    other = 1;
                else
                    failed = (i > 0 && put(&buf, ",", 1) < 0) || put(&buf, "[", 1) < 0 ||
                             put_json_text(&buf, PyBytes_AS_STRING(path),
                                           PyBytes_GET_SIZE(path), ',') < 0 ||
                             put_json_text(&buf, k, kn, ',') < 0 ||
                             put_int(&buf, mode, 0, ',') < 0 ||
                             put_json_text(&buf, r, rn, ',') < 0 ||
                             put_json_text(&buf, PyBytes_AS_STRING(target),
                                           PyBytes_GET_SIZE(target), ',') < 0 ||
                             put_int(&buf, size, 0, ']') < 0;
            }
            for (int j = 0; j < 5; j++)
                Py_DECREF(f[j]);
        }
        Py_DECREF(path);
        if (failed)
            goto fail;
    }
    if (other) {
        PyMem_Free(buf.data);
        Py_RETURN_NONE;
    }
    if (put(&buf, "]", 1) < 0)
        goto fail;
    PyObject *out = PyBytes_FromStringAndSize(buf.data, buf.len);
    PyMem_Free(buf.data);
    return out;
fail:
    PyMem_Free(buf.data);
    return NULL;
}

/* Whether `ref` (a str) is "git:" followed by `blob` (a str): without making the text. */
static int
is_git_ref(PyObject *ref, PyObject *blob)
{
    if (!PyUnicode_Check(ref) || !PyUnicode_Check(blob))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(blob);
    if (PyUnicode_GET_LENGTH(ref) != 4 + n)
        return 0;
    if (PyUnicode_IS_ASCII(ref) && PyUnicode_IS_ASCII(blob)) {
        const char *r = (const char *)PyUnicode_DATA(ref);
        return memcmp(r, "git:", 4) == 0 && memcmp(r + 4, PyUnicode_DATA(blob), n) == 0;
    }
    /* Not ASCII (no id git writes): compared as Python compares text, as the twin
       (manifest._git_delta_py) does, so that both give the same answer. */
    for (int i = 0; i < 4; i++)
        if (PyUnicode_READ_CHAR(ref, i) != (Py_UCS4) "git:"[i])
            return 0;
    return PyUnicode_Tailmatch(ref, blob, 4, 4 + n, 1) == 1;
}

/* git_delta(manifest, files) -> (mode, differing, gone, ours): what a tree stored as the
   differences from a git commit holds (manifest.encode_head). `files`: path -> blob id of
   the commit's regular files. An entry is the commit's when it is a file named "git:" and
   the blob at its path, of permission bits `mode`: the commonest bits among such files
   (0o644 where it is among the commonest, else the lowest of them). `ours`: the paths of
   those, `differing`: the manifest's other paths, each in the manifest's order; `gone`:
   the paths of `files` the manifest lacks, in their order. Twin: manifest._git_delta_py. */
static PyObject *
git_delta(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "git_delta(manifest, files)");
        return NULL;
    }
    PyObject *manifest = args[0], *files = args[1];
    Py_ssize_t n = PyDict_GET_SIZE(manifest), at = 0, k = 0;
    /* each entry's permission bits when it is the commit's file, else -1 */
    int *modes = PyMem_Malloc((n ? n : 1) * sizeof(int));
    Py_ssize_t counts[01000] = {0}, in_files = 0;
    PyObject *path, *entry, *differing = NULL, *gone = NULL, *ours = NULL;
    if (modes == NULL)
        return PyErr_NoMemory();
    while (PyDict_Next(manifest, &at, &path, &entry)) {
        PyObject *f[5];
        if (k >= n || !PyBytes_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "git_delta: a manifest of bytes, unchanged");
            goto fail;
        }
        modes[k] = -1;
        /* (held: an entry of another type is read by attribute, which may run code) */
        Py_INCREF(path);
        Py_INCREF(entry);
        int got = fields_of(entry, f);
        Py_DECREF(entry);
        if (got < 0) {
            Py_DECREF(path);
            goto fail;
        }
        PyObject *blob = PyDict_GetItemWithError(files, path); /* (borrowed) */
        Py_XINCREF(blob);
        Py_DECREF(path);
        if (blob == NULL && PyErr_Occurred()) {
            for (int j = 0; j < 5; j++)
                Py_DECREF(f[j]);
            goto fail;
        }
        in_files += blob != NULL;
        if (blob != NULL && PyUnicode_Check(f[0]) &&
            PyUnicode_CompareWithASCIIString(f[0], "file") == 0 && PyLong_CheckExact(f[1]) &&
            is_git_ref(f[2], blob) && PyBytes_Check(f[3]) && PyBytes_GET_SIZE(f[3]) == 0) {
            int overflow = 0;
            long m = PyLong_AsLongAndOverflow(f[1], &overflow);
            if (!overflow && m >= 0 && m < 01000) {
                modes[k] = (int)m;
                counts[m]++;
            }
        }
        Py_XDECREF(blob);
        for (int j = 0; j < 5; j++)
            Py_DECREF(f[j]);
        k++;
    }
    if (k != n || PyDict_GET_SIZE(manifest) != n) { /* (an attribute read changed it) */
        PyErr_SetString(PyExc_RuntimeError, "git_delta: the manifest changed");
        goto fail;
    }
    int mode = 0644;
    for (int m = 0; m < 01000; m++)
        if (counts[m] > counts[mode])
            mode = m;
    differing = PyList_New(0);
    gone = PyList_New(0);
    ours = PyList_New(0);
    if (differing == NULL || gone == NULL || ours == NULL)
        goto fail;
    at = 0, k = 0;
    while (PyDict_Next(manifest, &at, &path, &entry)) {
        if (k >= n) {
            PyErr_SetString(PyExc_RuntimeError, "git_delta: the manifest changed");
            goto fail;
        }
        if (PyList_Append(modes[k++] == mode ? ours : differing, path) < 0)
            goto fail;
    }
    if (in_files < PyDict_GET_SIZE(files)) {
        PyObject *blob;
        at = 0;
        while (PyDict_Next(files, &at, &path, &blob)) {
            int has = PyDict_Contains(manifest, path);
            if (has < 0 || (!has && PyList_Append(gone, path) < 0))
                goto fail;
        }
    }
    PyMem_Free(modes);
    return Py_BuildValue("(iNNN)", mode, differing, gone, ours);
fail:
    PyMem_Free(modes);
    Py_XDECREF(differing);
    Py_XDECREF(gone);
    Py_XDECREF(ours);
    return NULL;
}

static PyMethodDef methods[] = {
    {"changed", (PyCFunction)(void (*)(void))changed, METH_FASTCALL,
     "changed(dir_fd, names, cached) -> the names whose lstat key is not cached[name][0]"},
    {"listing", (PyCFunction)listing, METH_O,
     "listing(dir_fd) -> the names in the folder, as bytes, sorted"},
    {"bucketed", (PyCFunction)bucketed, METH_O,
     "bucketed(paths) -> BUCKETS lists: each path in that of zlib.crc32(path) % BUCKETS"},
    {"joined", (PyCFunction)(void (*)(void))joined, METH_FASTCALL,
     "joined(paths, manifest) -> the manifest's lines of those paths, joined"},
    {"bucket_lines", (PyCFunction)(void (*)(void))bucket_lines, METH_FASTCALL,
     "bucket_lines(paths, manifest) -> BUCKETS bytes: the lines of each bucket's paths"},
    {"json_rows", (PyCFunction)(void (*)(void))json_rows, METH_FASTCALL,
     "json_rows(paths, manifest) -> encode_full's rows as JSON, or None"},
    {"git_delta", (PyCFunction)(void (*)(void))git_delta, METH_FASTCALL,
     "git_delta(manifest, files) -> (mode, differing, gone, ours): encode_head's paths"},
    {"index_files", (PyCFunction)(void (*)(void))index_files, METH_FASTCALL,
     "index_files(body, hash_size, lead, racy_from, root_fd, threads, feed_fd) -> (files, "
     "vouching, tree) or None"},
    {"preload", (PyCFunction)(void (*)(void))preload, METH_FASTCALL,
     "preload(root_fd, cache, threads) -> a Preload: the stat cache's lstat calls, in "
     "threads"},
    {"seeded", (PyCFunction)(void (*)(void))seeded, METH_FASTCALL,
     "seeded(names, lead, vouching, cached, entries, entry, kind, size_cap, racy_after, "
     "shapes) -> the names left"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, 0, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    s_kind = PyUnicode_InternFromString("kind");
    s_mode = PyUnicode_InternFromString("mode");
    s_ref = PyUnicode_InternFromString("ref");
    s_target = PyUnicode_InternFromString("target");
    s_size = PyUnicode_InternFromString("size");
    if (s_kind == NULL || s_mode == NULL || s_ref == NULL ||
        s_target == NULL || s_size == NULL)
        return NULL;
    make_crc_table();
    if (PyType_Ready(&VouchingType) < 0 || PyType_Ready(&PreloadType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "Vouching", (PyObject *)&VouchingType) < 0 ||
                      PyModule_AddObjectRef(m, "Preload", (PyObject *)&PreloadType) < 0))
        Py_CLEAR(m);
    return m;
}
