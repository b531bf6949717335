"""A call's launches recorded once and replayed by later calls of the same call key.

A library call of the GPU backend does the same work every time its key (shapes, dtypes,
flags, capacities) repeats: it allocates the same outputs and scratch, and launches the same
kernels with the same parameters, except for the addresses of its arrays. A recorded call
finds out which parameter word is which address: every buffer it hands the kernels carries
an :class:`Address` (an int that knows the array it points into and its offset there), so
the values of its launch sequences say, word by word, "array ``i`` plus ``n`` bytes" or "this
constant". :class:`RecordingLauncher` keeps those values; :func:`replay_sequence` turns them
into one C launch sequence (:mod:`._driver_c`) whose words are those constants and offsets,
and a replay passes only the arrays' addresses.

A recording is refused (:attr:`RecordingLauncher.refused`) where a replay could not repeat
the call: a launch outside a sequence, the simulator, or no C launcher.
"""

from __future__ import annotations

STAGED = "staged"  # the source of a recorded call's staged values (:mod:`._staged`)


class Address(int):
    """The address ``value`` of byte ``offset`` of array ``source`` of a recorded call.

    Arithmetic keeps the source: ``address + n`` is byte ``offset + n`` of the same array
    (the scratch parts carved out of one allocation). Any other operation gives a plain int.
    """

    def __new__(cls, value, source, offset=0):
        address = super().__new__(cls, value)
        address.source = source
        address.offset = offset
        return address

    def __add__(self, n):
        return Address(int(self) + n, self.source, self.offset + n)

    __radd__ = __add__


def _launch_module():
    from . import _launch  # (imported late: _launch imports numba, and it imports this)

    return _launch


def _runtime_driver():
    """The runtime's driver launcher, or None (imported late, as :mod:`._launch` is)."""
    from ._runtime import RUNTIME

    return RUNTIME.driver


class RecordingLauncher:
    """A :class:`._launch.Launcher` for ``stream`` that also keeps what its sequences launched.

    Parameters
    ----------
    stream : int
        A ``CUstream`` handle.
    """

    records = True  # (what :func:`._launch.launcher_for` looks for)

    def __init__(self, stream):
        launch = _launch_module()
        self._launcher = launch.Launcher(stream)
        self.device = self._launcher.device
        self.handle = self._launcher.handle
        self.overlap = self._launcher.overlap
        self.runs = []  # (sequence, values, start, stop) of every sequence launched
        driver = None if launch.SIM else _runtime_driver()
        self.refused = driver is None or driver.c is None

    def __call__(self, *args, **kwargs):
        self.refused = True  # (a single launch: its arguments are not recorded)
        self._launcher(*args, **kwargs)

    def sequence(self, sequence, values, start, stop):
        self.run(sequence, values, None, 0, start, stop)

    def run(self, sequence, values, status=None, final=0, start=0, stop=None):
        if status is not None:
            self.refused = True  # (a replay runs validate=False calls only: no status words)
        stop = len(sequence.steps) if stop is None else stop
        self.runs.append((sequence, values, start, stop))
        self._launcher.run(sequence, values, status, final, start, stop)


def _word(value, staged):
    """(template word, slot) of a recorded value: an address's offset and its array (value
    ``staged`` for the staged block), or a constant and -1."""
    if isinstance(value, Address):
        return value.offset, staged if value.source == STAGED else value.source
    return int(value), -1


def replay_sequence(launcher, staged):
    """The recorded launches of ``launcher`` (a :class:`RecordingLauncher`) as one C launch
    sequence whose values are the addresses of the call's arrays, in their sources' order,
    the staged block's being value ``staged``; and the name of each launch's kernel (for an
    error). None when the recording was refused."""
    if launcher.refused:
        return None
    launch = _launch_module()
    steps, names = [], []
    for sequence, values, start, stop in launcher.runs:
        for i in range(start, stop):
            step = sequence.steps[i]
            words = [_word(v, staged) for v in sequence.args(i, values)]
            template, slots = [w for w, _ in words], [k for _, k in words]
            steps.append(launch.c_step(step, launcher.device, launcher.overlap, template, slots))
            names.append(step.kernel.name)
    driver = _runtime_driver()
    return driver.c.LaunchSequence(driver.address, steps), tuple(names)
