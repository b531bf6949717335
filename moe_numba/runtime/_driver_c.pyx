# cython: language_level=3
"""Kernel launches through the CUDA driver's ``cuLaunchKernelEx``, called from C.

:mod:`._driver` calls the driver with ctypes: a foreign call that converts its arguments,
after ``struct.pack_into`` has packed the kernel's parameters. Here both happen in C, and a
:class:`LaunchSequence` runs all the launches of a library call (planned once per call key)
in one call from Python, its parameters taken from a template and from the call's values.

Nothing is linked against libcuda: the address of its ``cuLaunchKernelEx`` (and of the other
driver functions called here) comes from the ctypes handle that :mod:`._driver` opened.
Every parameter of this package's kernels is 8 bytes (a ``CPointer`` or an int64), so a
launch's parameters are one array of int64 words, passed as the ``extra`` buffer
(``CU_LAUNCH_PARAM_BUFFER_POINTER``).

A replay that stages its capacities (:mod:`moe_numba.torch._replay`) checks them, writes them
into a pinned block and marks the block's reuse with the helpers at the end.
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

cdef enum:
    MOST_WORDS = 64  # the most parameters of a kernel (this package's have at most 30)
    PARAM_END = 0  # CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE
    PARAM_BUFFER_POINTER = 1
    PARAM_BUFFER_SIZE = 2
    PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_...


# the driver's structures, field for field (cuda.h: CUlaunchAttributeValue is a union of 64
# bytes, CUlaunchAttribute its id padded to 8 bytes and the value, CUlaunchConfig below)
cdef union AttributeValue:
    char pad[64]
    int value

cdef struct Attribute:
    int id
    char pad[4]
    AttributeValue val

cdef struct Config:
    unsigned int grid_x, grid_y, grid_z
    unsigned int block_x, block_y, block_z
    unsigned int shmem
    void *stream
    Attribute *attrs
    unsigned int num_attrs

ctypedef int (*LaunchFn)(const Config *, void *, void **, void **) noexcept nogil
ctypedef int (*DeviceFn)(int *) noexcept nogil
ctypedef int (*EventFn)(void *) noexcept nogil
ctypedef int (*RecordFn)(void *, void *) noexcept nogil


def context_device(uintptr_t get_device):
    """The device of the calling thread's current context (``cuCtxGetDevice`` at
    ``get_device``), or -1 without one."""
    cdef int device = 0
    if (<DeviceFn>get_device)(&device):
        return -1
    return device


def layout():
    """``{name: (size, offset of the field that follows the ints)}`` of the structures, for
    the test that they match cuda.h."""
    cdef Config c
    cdef Attribute a
    return {
        "config": (sizeof(Config), <char *>&c.stream - <char *>&c, <char *>&c.attrs - <char *>&c,
                   <char *>&c.num_attrs - <char *>&c),
        "attribute": (sizeof(Attribute), <char *>&a.val - <char *>&a),
    }


cdef inline int _launch(LaunchFn fn, Config *config, void *function, int64_t *words, int n):
    cdef size_t size = 8 * n
    cdef void *extra[5]
    extra[0] = <void *>PARAM_BUFFER_POINTER
    extra[1] = <void *>words
    extra[2] = <void *>PARAM_BUFFER_SIZE
    extra[3] = <void *>&size
    extra[4] = <void *>PARAM_END
    cdef int err
    with nogil:  # (the driver copies the words during the call; it may wait for queue room)
        err = fn(config, function, NULL, extra)
    return err


def launch(uintptr_t launch_fn, uintptr_t config, uintptr_t function, tuple args):
    """One launch: ``cuLaunchKernelEx`` at ``launch_fn`` with the configuration at address
    ``config``, the kernel ``function`` and ``args`` (ints, at most 64) as int64 words.

    Returns the driver's result (0: success).
    """
    cdef int n = len(args)
    cdef int64_t words[MOST_WORDS]
    if n > MOST_WORDS:
        raise ValueError(f"a kernel takes at most {MOST_WORDS} parameters; got {n}")
    cdef int i
    for i in range(n):
        words[i] = args[i]
    return _launch(<LaunchFn>launch_fn, <Config *>config, <void *>function, words, n)


cdef struct Step:
    Config config
    Attribute attribute
    void *function
    int n
    int64_t *template  # the words: constants, and offsets of the words that take a value
    int *slots  # per word: -1 (the template's) or the index of the call's value added to it


cdef class LaunchSequence:
    """The launches of one planned call, on any stream.

    Parameters
    ----------
    launch_fn : int
        The address of the driver's ``cuLaunchKernelEx``.
    steps : list of tuple
        Per launch ``(function, grid, block, shmem, dependent, template, slots)``: the kernel
        handle (``CUkernel``/``CUfunction`` as an int), grid and block as 3 ints each, the
        dynamic shared memory, whether it is a programmatic dependent, the parameter words
        (ints) and, per word, -1 (the word as it is) or the index of the value of
        :meth:`run` that is added to it (an address plus the word's offset).
    """

    cdef LaunchFn fn
    cdef Step *steps
    cdef readonly int size

    def __cinit__(self, uintptr_t launch_fn, list steps):
        self.fn = <LaunchFn>launch_fn
        self.size = 0
        self.steps = <Step *>calloc(max(1, len(steps)), sizeof(Step))
        if self.steps == NULL:
            raise MemoryError()
        cdef Step *s
        cdef int j
        for function, grid, block, shmem, dependent, template, slots in steps:
            s = &self.steps[self.size]
            self.size += 1  # (counted before its arrays: __dealloc__ frees what is there)
            s.n = len(template)
            if s.n > MOST_WORDS or len(slots) != s.n:
                raise ValueError(f"bad launch step: {len(template)} words, {len(slots)} slots")
            s.function = <void *><uintptr_t>function
            s.config.grid_x, s.config.grid_y, s.config.grid_z = grid
            s.config.block_x, s.config.block_y, s.config.block_z = block
            s.config.shmem = shmem
            if dependent:
                s.attribute.id = PROGRAMMATIC_STREAM_SERIALIZATION
                s.attribute.val.value = 1
                s.config.num_attrs = 1
            s.template = <int64_t *>calloc(max(1, s.n), sizeof(int64_t))
            s.slots = <int *>calloc(max(1, s.n), sizeof(int))
            if s.template == NULL or s.slots == NULL:
                raise MemoryError()
            for j in range(s.n):
                s.template[j] = template[j]
                s.slots[j] = slots[j]

    def __dealloc__(self):
        cdef int i
        if self.steps != NULL:
            for i in range(self.size):
                free(self.steps[i].template)
                free(self.steps[i].slots)
            free(self.steps)

    def run(self, uintptr_t stream, tuple values, int start, int stop):
        """Launch steps ``start`` to ``stop - 1`` on ``stream`` (a ``CUstream`` as an int),
        each word of a slot its template word plus its value of ``values`` (ints).

        Returns None, or ``(step, driver result)`` for the first launch that failed (the
        steps after it are not launched).
        """
        cdef int64_t words[MOST_WORDS]
        cdef Config config
        cdef Step *s
        cdef int i, j, k, err
        cdef int count = len(values)
        if start < 0 or stop > self.size:
            raise IndexError(f"steps {start}..{stop} of a sequence of {self.size}")
        for i in range(start, stop):
            s = &self.steps[i]
            for j in range(s.n):
                k = s.slots[j]
                if k < 0:
                    words[j] = s.template[j]
                elif k < count:
                    words[j] = s.template[j] + <int64_t>values[k]
                else:
                    raise IndexError(f"step {i} takes value {k}; {count} given")
            memcpy(&config, &s.config, sizeof(Config))
            config.stream = <void *>stream
            if config.num_attrs:
                config.attrs = &s.attribute
            err = _launch(self.fn, &config, s.function, words, s.n)
            if err:
                return i, err
        return None


# The staged capacities of a replay.

def padded_rows(tuple counts, Py_ssize_t n, int64_t alignment, int64_t most):
    """``sum ceil(c / alignment) * alignment`` over ``counts``, where they are ``n`` exact
    ints in [0, 2**63 - 1], ``alignment`` > 0 and the sum at most ``most``; else -1."""
    if len(counts) != n or alignment <= 0:
        return -1
    cdef int64_t total = 0
    cdef int64_t c
    cdef int overflow = 0
    for x in counts:
        if not PyLong_CheckExact(x):
            return -1
        c = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow or c < 0:
            return -1
        c = c // alignment + (1 if c % alignment else 0)  # (no overflow: c < 2**63)
        if c > (most - total) // alignment:
            return -1
        total += c * alignment
    return total


def write_words(uintptr_t address, tuple values):
    """Store ``values`` (ints in the int64 range) as int64 words from ``address`` on."""
    cdef int64_t *words = <int64_t *>address
    cdef Py_ssize_t i
    for i in range(len(values)):
        words[i] = values[i]


def event_query(uintptr_t query_fn, uintptr_t event):
    """``cuEventQuery`` at ``query_fn`` of ``event``: 0 once it has passed."""
    return (<EventFn>query_fn)(<void *>event)


def event_record(uintptr_t record_fn, uintptr_t event, uintptr_t stream):
    """``cuEventRecord`` at ``record_fn`` of ``event`` on ``stream``: the driver's result."""
    return (<RecordFn>record_fn)(<void *>event, <void *>stream)
