"""The tensorpress HDF5 filter: error-bounded datasets that h5py reads and writes itself.

Importing this module (``tensorpress.formats`` does) registers filter :data:`FILTER_ID`
with the HDF5 library h5py links, from callbacks made with ctypes, so no compiled
plugin is needed. Each HDF5 chunk becomes one tensorpress container stream (checksums
and the resolved bound travel with every chunk); the codec, bound, element size, byte
order and chunk shape go in the filter's ``cd_values`` (see formats/SPEC.md, "The HDF5
filter"), and a chunk is decoded only when its stream holds exactly that chunk::

    f.create_dataset("t", data=x, chunks=(64, 256), **hdf5_filter.filter(abs=1e-3))
    f["t"][10:20]  # any process that imported tensorpress decodes the chunks touched
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import signal
import struct
import threading
import warnings

import h5py
import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.registry import get_codec
from . import hdf5_lib
from .errors import FormatError
from .stream_reader import ContainerReader
from .stream_writer import encode_array

#: the filter's HDF5 id: unassigned in The HDF Group's registry and unused by hdf5plugin
#: (formats/SPEC.md, "Filter ID", says why this one); to be registered with The HDF Group
FILTER_ID = 32100
#: the id files were written with before: 307, BZIP2's in the registry. Never registered
#: with HDF5 (bzip2 owns it): tensorpress's readers decode such datasets from their stored
#: chunks, and ``tensorpress convert`` rewrites them with :data:`FILTER_ID`
LEGACY_FILTER_ID = 307
#: the version of the cd_values layout written (SPEC.md); version 1 (little-endian
#: only, no byte-order value) still reads
CD_VERSION = 2
CD_VERSIONS = (1, 2)
#: codec numbers in cd_values[1]: the error-bounded codecs, the lossless one, quant (bits)
CODECS = {1: "sz", 2: "block", 3: "int8", 4: "zstd", 5: "quant"}
CODEC_NUMBERS = {name: n for n, name in CODECS.items()}
#: bound modes in cd_values[2] (a rel bound is resolved to abs before it gets here)
MODES = {0: None, 1: "abs", 2: "pw_rel"}
MODE_NUMBERS = {name: n for n, name in MODES.items()}
#: cd_values[0:5] come from :func:`filter`; set_local appends the element size, the
#: byte order (version 2), the chunk rank and the chunk's dimensions
USER_VALUES = 5
MAX_RANK = 32
MAX_CD_VALUES = USER_VALUES + 3 + MAX_RANK
#: byte order values in cd_values[6] (version 2), as numpy spells them
BYTE_ORDERS = {0: "<", 1: ">"}
#: the largest chunk HDF5 allows, in bytes: a larger one in cd_values is a lie
MAX_CHUNK_BYTES = (1 << 32) - 1

_lib = None
#: why the filter is not registered, or None when it is
unavailable: str | None = None
_plugin_path_said = False


def __getattr__(name: str):
    """``PLUGIN_PATH``: the folder of the compiled plugin, for other programs'
    ``HDF5_PLUGIN_PATH`` (formats/hdf5_plugin_path.py); warns once where it was not built."""
    global _plugin_path_said
    if name != "PLUGIN_PATH":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import hdf5_plugin_path

    if hdf5_plugin_path.plugin_library() is None and not _plugin_path_said:
        _plugin_path_said = True
        warnings.warn(hdf5_plugin_path.NOT_BUILT, RuntimeWarning, stacklevel=2)
    return hdf5_plugin_path.PLUGIN_PATH


def filter(  # noqa: A001  (named as hdf5plugin's helpers are used: **filter(...))
    abs: float | None = None,  # noqa: A002
    rel: float | None = None,
    pw_rel: float | None = None,
    *,
    codec: str = "sz",
    value_range: tuple[float, float] | None = None,
) -> dict:
    """Keywords for ``h5py.Group.create_dataset`` that compress with tensorpress.

    Give one bound: ``abs`` (absolute), ``pw_rel`` (times |x| per element) or ``rel``
    with ``value_range=(lo, hi)``, the dataset's value range (a chunk cannot know it),
    resolved to the absolute bound ``rel * (hi - lo)``. ``codec`` is one of
    :data:`CODECS`' names, with its default parameters; ``"zstd"`` and ``"quant"`` (4 bits a
    value) take no bound.
    """
    if unavailable is not None:
        raise RuntimeError(f"the tensorpress HDF5 filter is not registered: {unavailable}")
    if codec not in CODEC_NUMBERS:
        raise ValueError(f"codec {codec!r} has no HDF5 filter; use one of {sorted(CODEC_NUMBERS)}")
    if rel is not None:
        if value_range is None:
            raise ValueError(
                "a rel bound needs the dataset's value range, which an HDF5 chunk does not "
                "know: give value_range=(lo, hi), or an abs or pw_rel bound"
            )
        if abs is not None or pw_rel is not None:
            raise ValueError("give exactly one error bound: abs=..., rel=... or pw_rel=...")
        lo, hi = (float(v) for v in value_range)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(
                f"value_range must be finite (lo, hi) with lo <= hi, got {value_range}"
            )
        abs = ErrorBound("rel", rel).resolve_range(lo, hi).tolerance
    elif value_range is not None:
        raise ValueError("value_range goes with a rel bound only")
    bounds = {k: v for k, v in (("abs", abs), ("pw_rel", pw_rel)) if v is not None}
    checked = get_codec(codec, **bounds)  # refuses a bound the codec does not take
    if checked.bounded:
        checked.require_bound()  # and a missing one
    ((mode, value),) = bounds.items() if bounds else ((None, 0.0),)
    lo_word, hi_word = struct.unpack("<II", struct.pack("<d", float(value)))
    opts = (CD_VERSION, CODEC_NUMBERS[codec], MODE_NUMBERS[mode], lo_word, hi_word)
    return {"compression": FILTER_ID, "compression_opts": opts}


def parse_cd_values(cd: list[int]) -> dict:
    """What cd_values say: ``codec``, ``bound`` (keywords for get_codec) and, once
    set_local has run, ``itemsize``, ``byteorder`` (``"<"`` or ``">"``) and ``chunks``.
    ValueError for values no tensorpress filter wrote (a file controls them)."""
    if len(cd) < USER_VALUES or cd[0] not in CD_VERSIONS:
        raise ValueError(
            f"cd_values {list(cd)} are not a tensorpress filter layout this version reads "
            f"({', '.join(map(str, CD_VERSIONS))}): upgrade tensorpress, or the file is damaged"
        )
    if cd[1] not in CODECS or cd[2] not in MODES:
        raise ValueError(f"unknown codec {cd[1]} or bound mode {cd[2]} in cd_values")
    (value,) = struct.unpack("<d", struct.pack("<II", cd[3], cd[4]))
    mode = MODES[cd[2]]
    out = {"codec": CODECS[cd[1]], "bound": {} if mode is None else {mode: value}}
    if len(cd) > USER_VALUES:
        out.update(_chunk_layout(list(cd)))
    return out


def _chunk_layout(cd: list[int]) -> dict:
    """``itemsize``, ``byteorder`` and ``chunks`` from the values set_local appends, each
    checked: a file that lies about them must not size what the filter hands HDF5."""
    order_at = USER_VALUES + 1 if cd[0] >= 2 else None  # version 1: little-endian only
    rank_at = USER_VALUES + 1 + (order_at is not None)
    if len(cd) <= rank_at:
        raise ValueError(f"cd_values {cd} end before the chunk rank")
    itemsize, rank = cd[USER_VALUES], cd[rank_at]
    chunks = tuple(cd[rank_at + 1 :])
    if itemsize not in (2, 4, 8):
        raise ValueError(f"cd_values give element size {itemsize}, not 2, 4 or 8")
    if order_at is not None and cd[order_at] not in BYTE_ORDERS:
        raise ValueError(f"cd_values give byte order {cd[order_at]}, not 0 or 1")
    if not 1 <= rank <= MAX_RANK or len(chunks) != rank or 0 in chunks:
        raise ValueError(f"cd_values {cd} do not end with a chunk shape of rank {rank}")
    if math.prod(chunks) * itemsize > MAX_CHUNK_BYTES:
        raise ValueError(f"cd_values give a chunk {chunks} larger than HDF5 allows")
    order = "<" if order_at is None else BYTE_ORDERS[cd[order_at]]
    return {"itemsize": itemsize, "byteorder": order, "chunks": chunks}


def chunk_values(cd: list[int]) -> dict:
    """:func:`parse_cd_values` of a stored dataset's cd_values, which must hold the chunk
    layout set_local appends (without it, what a chunk decodes to cannot be checked)."""
    p = parse_cd_values(cd)
    if "chunks" not in p:
        raise ValueError(
            f"cd_values {list(cd)} lack the element size and chunk shape that the "
            "tensorpress filter records: the dataset was not written by it"
        )
    return p


def check_dataset(cd: list[int], dtype, chunks) -> dict:
    """The parsed cd_values of an h5py dataset of ``dtype`` and ``chunks`` stored with the
    filter; FormatError when they disagree with the dataset (a crafted file): HDF5 copies
    a whole chunk of the dataset's own shape out of what the filter returns."""
    try:
        p = chunk_values(cd)
    except ValueError as exc:
        raise FormatError(str(exc)) from None
    dtype = np.dtype(dtype)
    said = (p["itemsize"], p["byteorder"], p["chunks"])
    real = (dtype.itemsize, ">" if dtype.byteorder == ">" else "<", tuple(chunks or ()))
    if dtype.kind != "f" or said != real:
        raise FormatError(
            f"the filter's cd_values describe {p['chunks']} chunks of {p['byteorder']}f"
            f"{p['itemsize']}, the dataset has {real[2]} chunks of {dtype.str}: the file "
            "is damaged or crafted; it is not read"
        )
    return p


def check_stream(h, dtype, chunks, codec: str | None = None, bound=None) -> None:
    """FormatError unless stream header ``h`` holds exactly a chunk of ``chunks`` values
    of ``dtype`` (in either byte order; streams are little-endian), with ``codec`` and
    ``bound`` (get_codec keywords) when given, or losslessly (``zstd``: ``tensorpress
    convert`` stores a short last chunk so): checked before anything is decoded."""
    want = np.dtype(dtype).newbyteorder("<")
    if h.dtype != want or tuple(h.shape) != tuple(chunks):
        raise FormatError(
            f"the chunk's stream holds {h.dtype} {tuple(h.shape)} ({h.original_bytes} "
            f"bytes), the dataset's chunk is {want} {tuple(chunks)}: refused before decoding"
        )
    if h.codec.get("id") == "zstd" and h.bound is None:
        return  # exact values meet any bound
    if codec is not None and h.codec.get("id") != codec:
        raise FormatError(f"the chunk's stream uses codec {h.codec.get('id')!r}, not {codec!r}")
    if bound is not None and not _within(h.bound, bound):
        has = None if h.bound is None else h.bound.to_dict()
        raise FormatError(f"the chunk's stream has bound {has}, looser than the dataset's {bound}")


def _within(has, bound: dict) -> bool:
    """Whether a stream's resolved bound ``has`` keeps the dataset's ``bound`` (cd_values:
    abs or pw_rel, {} for none): the same kind, a tolerance no larger (a ``rel`` bound
    resolved to its tolerance is an absolute one, as ``tensorpress convert`` stores it)."""
    if has is None or not bound:
        return has is None and not bound
    ((mode, value),) = bound.items()
    kind = "pw_rel" if has.mode == "pw_rel" else "abs"
    return kind == mode and has.tolerance <= value


def encode_chunk(data, cd: list[int], missing=None, params=None) -> np.ndarray:
    """One HDF5 chunk (bytes-like, floats in the byte order cd_values give) as a
    container stream (little-endian, as every stream); ``missing``: the ``MissingMap``
    whose markers the chunk holds (missing.py); ``params``: codec parameters in place
    of the defaults (e.g. the ``sz`` predictor a PSNR search kept: each payload names
    its predictor, so the filter decodes it whatever cd_values say)."""
    p = chunk_values(cd)
    dtype = np.dtype(f"{p['byteorder']}f{p['itemsize']}")
    x = np.frombuffer(data, dtype=dtype)
    if x.size != math.prod(p["chunks"]):
        raise ValueError(f"the chunk holds {x.size} values, cd_values say {p['chunks']}")
    x = x.reshape(p["chunks"]).astype(dtype.newbyteorder("<"), copy=False)
    codec = get_codec(p["codec"], **(params or {}), **p["bound"])
    stream = encode_array(
        x,
        codec,
        codec.resolve_bound(x),
        workers=1,
        chunk_bytes=codec.default_chunk_bytes,
        missing=missing,
    )
    return np.frombuffer(stream, dtype=np.uint8)


def decode_chunk(data, cd: list[int]) -> np.ndarray:
    """A container stream (bytes-like) back to the chunk's bytes, exactly the chunk that
    cd_values describe, in their byte order. Raises, before anything is decoded, when
    cd_values lack the chunk layout or the stream's dtype, shape, codec or bound differ
    from theirs (so a stream that declares more values than the chunk is never inflated)."""
    p = chunk_values(cd)
    dtype = np.dtype(f"{p['byteorder']}f{p['itemsize']}")
    with ContainerReader(data, workers=1) as reader:
        check_stream(reader.header, dtype, p["chunks"], p["codec"], p["bound"])
        x = np.ascontiguousarray(reader.read())
    if x.dtype != dtype:
        x = x.astype(dtype)  # a big-endian dataset's bytes
    return x.reshape(-1).view(np.uint8)


def _report(what: str, exc: BaseException) -> None:
    """HDF5 only hears "failure" from a callback: say why on the Python side."""
    try:
        warnings.warn(f"tensorpress HDF5 filter, {what}: {exc}", RuntimeWarning, stacklevel=1)
    except Exception:  # warnings raised as errors must not escape into C
        pass


def _filter(flags, cd_nelmts, cd_values, nbytes, buf_size, buf):
    """H5Z_func_t: replace ``*buf`` by the encoded (or decoded) chunk, allocated with
    HDF5's allocator; returns its size, or 0 so HDF5 reports the failure. After an
    interrupt (:func:`raise_interrupt`) every chunk fails at once, so the read stops."""
    if _interrupt is not None:
        return 0
    try:
        cd = [cd_values[i] for i in range(cd_nelmts)]
        data = (ctypes.c_char * nbytes).from_address(buf[0])
        if flags & hdf5_lib.FLAG_REVERSE:
            out = decode_chunk(memoryview(data), cd)
        else:
            out = encode_chunk(memoryview(data), cd)
        n, size = out.nbytes, max(out.nbytes, 1)
        new = _lib.H5allocate_memory(size, False)
        if not new:
            raise MemoryError(f"HDF5 could not allocate {n} bytes")
        ctypes.memmove(new, out.ctypes.data, n)
        _lib.H5free_memory(buf[0])
        buf[0] = new
        buf_size[0] = size
        # no call after this test, so a signal handled later is handled outside this frame
        return 0 if _interrupt is not None else n
    except Exception as exc:  # nothing may unwind through HDF5's C frames
        _report("reading a chunk" if flags & hdf5_lib.FLAG_REVERSE else "writing a chunk", exc)
        return 0
    except BaseException as exc:  # Ctrl-C, SIGTERM: raised once h5py has returned
        _remember(exc)
        return 0


def _set_local(dcpl_id, type_id, space_id):
    """H5Z_set_local_func_t: append the element size, byte order and chunk shape to
    cd_values (layout :data:`CD_VERSION`), and refuse what the codec cannot encode
    (returns -1, so dataset creation fails)."""
    try:
        flags = ctypes.c_uint()
        n = ctypes.c_size_t(MAX_CD_VALUES)
        cd = (ctypes.c_uint * MAX_CD_VALUES)()
        config = ctypes.c_uint()
        if _lib.H5Pget_filter_by_id2(dcpl_id, FILTER_ID, flags, n, cd, 0, None, config) < 0:
            raise RuntimeError("H5Pget_filter_by_id2 failed")
        p = parse_cd_values(list(cd[: min(n.value, USER_VALUES)]))  # set_local adds the rest
        size = _lib.H5Tget_size(type_id)
        if _lib.H5Tget_class(type_id) != hdf5_lib.T_FLOAT or size not in (2, 4, 8):
            raise TypeError("the filter takes float16, float32 or float64 datasets")
        order = _lib.H5Tget_order(type_id)
        if order not in (hdf5_lib.ORDER_LE, hdf5_lib.ORDER_BE):
            raise TypeError("the filter takes little- or big-endian floats")
        if f"float{8 * size}" not in get_codec(p["codec"], **p["bound"]).dtypes:
            raise TypeError(f"codec {p['codec']!r} does not take float{8 * size}")
        dims = (hdf5_lib.hsize_t * 32)()
        rank = _lib.H5Pget_chunk(dcpl_id, 32, dims)
        if rank < 0:
            raise RuntimeError("H5Pget_chunk failed: the dataset is not chunked")
        big = int(order == hdf5_lib.ORDER_BE)
        head = [CD_VERSION, *cd[1:USER_VALUES]]  # always the current layout
        values = head + [size, big, rank] + [int(d) for d in dims[:rank]]
        arr = (ctypes.c_uint * len(values))(*values)
        if _lib.H5Pmodify_filter(dcpl_id, FILTER_ID, flags.value, len(values), arr) < 0:
            raise RuntimeError("H5Pmodify_filter failed")
        return 1
    except Exception as exc:
        _report("creating a dataset", exc)
        return -1
    except BaseException as exc:  # Ctrl-C, SIGTERM: raised once h5py has returned
        _remember(exc)
        return -1


#: the KeyboardInterrupt (or SIGTERM's exception) that arrived while a callback ran:
#: nothing may unwind through HDF5's C frames, so the callback fails its chunk, HDF5
#: fails the call, and :func:`raise_interrupt` raises this once h5py has returned
_interrupt: BaseException | None = None


def _remember(exc: BaseException) -> None:
    global _interrupt
    if _interrupt is None:
        _interrupt = exc


def raise_interrupt() -> None:
    """Raise (once) the interrupt a filter callback kept; nothing when there is none.
    Call it where h5py returns or raises after reading or writing filtered chunks."""
    global _interrupt
    exc, _interrupt = _interrupt, None
    if exc is not None:
        raise exc.with_traceback(None)


def forget_interrupt() -> None:
    """Drop the kept interrupt: its exception was raised and handled after all."""
    global _interrupt
    _interrupt = None


def deferring(handler):
    """Python signal handler ``handler`` (one that raises, as Ctrl-C's does), made safe
    for the callbacks: while one runs on the main thread's stack (a signal is handled
    where Python code runs, its first line included, outside any ``try``), what
    ``handler`` raises is kept for :func:`raise_interrupt` instead of escaping into C."""

    def handle(signum, frame):
        try:
            handler(signum, frame)
        except BaseException as exc:
            # kept either way: raised from a finalizer or a weakref callback (an import
            # lock's, say), the exception is printed and dropped, and only the kept one
            # stops the job (``raise_interrupt`` before an output is committed)
            _remember(exc)
            if not _in_callback(frame):
                raise

    handle.deferred = handler
    return handle


def _in_callback(frame) -> bool:
    """Whether ``frame`` or a frame below it is one of the filter's callbacks."""
    while frame is not None:
        if frame.f_code in _CALLBACK_CODES:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def interrupts_deferred(signals=(signal.SIGINT,)):
    """Run the block with the handlers of ``signals`` wrapped by :func:`deferring`, and
    raise an interrupt a callback kept when the block ends (instead of the "filter
    returned failure" error h5py raised for it). Handlers are only set on the main
    thread; elsewhere a kept interrupt is still raised."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            handler = signal.getsignal(sig)
            if callable(handler) and not hasattr(handler, "deferred"):
                previous[sig] = signal.signal(sig, deferring(handler))
    try:
        yield
    except BaseException:
        raise_interrupt()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise_interrupt()


def is_tensorpress_filter(fid: int, cd) -> bool:
    """Whether filter ``fid`` with cd_values ``cd`` in a dataset's pipeline is this one:
    :data:`FILTER_ID`, or :data:`LEGACY_FILTER_ID` with cd_values in this filter's
    layout (version, codec, bound mode and bound), which bzip2's one value is not."""
    if fid == FILTER_ID:
        return True
    if fid != LEGACY_FILTER_ID:
        return False
    try:
        parse_cd_values([int(v) for v in cd])
    except (ValueError, OverflowError):
        return False
    return True


def _holder(fid: int) -> str:
    """The name of the filter HDF5 has registered as ``fid`` (HDF5 gives it to a
    pipeline that names the id; "" for a filter without a name)."""
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    plist.set_filter(fid, h5py.h5z.FLAG_OPTIONAL, ())
    return plist.get_filter(0)[3].decode("utf-8", "replace")


def _register() -> None:
    """Register the filter once with h5py's HDF5; on failure, or when another library
    holds :data:`FILTER_ID` (it is left in place: warned once), say why in
    :data:`unavailable`."""
    global _lib, unavailable, _class
    try:
        _lib = hdf5_lib.load_hdf5()
    except OSError as exc:
        unavailable = str(exc)
        return
    holder = _holder(FILTER_ID) if h5py.h5z.filter_avail(FILTER_ID) else None
    if holder == NAME.decode():  # this module imported under a second name: it works
        return
    # the compiled plugin (formats/hdf5_plugin, found in HDF5_PLUGIN_PATH) decodes the same
    # bytes and encodes none: this filter, which also writes, replaces it in this process
    if holder is not None and not holder.startswith(COMPILED_PLUGIN_NAME):
        unavailable = (
            f"HDF5 filter id {FILTER_ID} is already registered, by {holder or 'a filter'!r}; "
            "tensorpress leaves it in place: this process cannot write tensorpress-filter "
            "datasets, and h5py hands those it reads to that filter (tp.open, H5Dataset "
            "and tensorpress decompress decode them themselves); to use the tensorpress "
            f"filter, remove what registers id {FILTER_ID} (a package imported earlier, or "
            "a plugin in HDF5_PLUGIN_PATH)"
        )
        message = f"tensorpress HDF5 filter not registered: {unavailable}"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    _class = hdf5_lib.FilterClass(
        hdf5_lib.CLASS_T_VERSION,
        FILTER_ID,
        1,
        1,
        NAME,
        hdf5_lib.CAN_APPLY_FUNC(),
        _SET_LOCAL,
        _FILTER,
    )
    h5py.h5z.register_filter(ctypes.addressof(_class))


#: the filter's name, which HDF5 tools print where it is missing
NAME = b"tensorpress: error-bounded lossy (needs: import tensorpress)"
#: how the compiled plugin's name begins (formats/hdf5_plugin/plugin.c)
COMPILED_PLUGIN_NAME = "tensorpress: error-bounded lossy (compiled plugin"
# the callbacks and the class live as long as the process: HDF5 keeps their addresses
_FILTER = hdf5_lib.FILTER_FUNC(_filter)
_SET_LOCAL = hdf5_lib.SET_LOCAL_FUNC(_set_local)
_CALLBACK_CODES = (_filter.__code__, _set_local.__code__)
_class = None
_register()
