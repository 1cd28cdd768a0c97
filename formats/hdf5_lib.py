"""The few HDF5 C functions the tensorpress filter calls, through ctypes, from the very
library h5py links (a second copy of libhdf5 would hold its own filter table and heap).

Only what a filter needs: its class structure (``H5Z_class2_t``), the callback types,
HDF5's allocator (a filter hands HDF5 buffers that HDF5 frees) and the property and
datatype queries of the ``set_local`` callback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

import h5py

hid_t = ctypes.c_int64  # HDF5 >= 1.10
herr_t = ctypes.c_int
htri_t = ctypes.c_int
hsize_t = ctypes.c_uint64

#: ``size_t filter(flags, cd_nelmts, cd_values, nbytes, *buf_size, **buf)``; 0 = failure
FILTER_FUNC = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.c_uint,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_uint),
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_void_p),
)
#: ``htri_t can_apply(dcpl_id, type_id, space_id)``: 1 yes, 0 no, < 0 error
CAN_APPLY_FUNC = ctypes.CFUNCTYPE(htri_t, hid_t, hid_t, hid_t)
#: ``herr_t set_local(dcpl_id, type_id, space_id)``: >= 0 success
SET_LOCAL_FUNC = ctypes.CFUNCTYPE(herr_t, hid_t, hid_t, hid_t)

#: ``H5Z_CLASS_T_VERS``: the version of the structure below
CLASS_T_VERSION = 1
#: ``flags`` bit set when a chunk is read (decoded) rather than written
FLAG_REVERSE = 0x0100
#: ``H5T_FLOAT`` and ``H5T_ORDER_LE`` / ``H5T_ORDER_BE``
T_FLOAT = 1
ORDER_LE, ORDER_BE = 0, 1


class FilterClass(ctypes.Structure):
    """``H5Z_class2_t``: what ``H5Zregister`` (``h5py.h5z.register_filter``) reads."""

    _fields_ = [
        ("version", ctypes.c_int),
        ("id", ctypes.c_int),
        ("encoder_present", ctypes.c_uint),
        ("decoder_present", ctypes.c_uint),
        ("name", ctypes.c_char_p),
        ("can_apply", CAN_APPLY_FUNC),
        ("set_local", SET_LOCAL_FUNC),
        ("filter", FILTER_FUNC),
    ]


def _candidates():
    """Paths where h5py's libhdf5 may be, the one already mapped first, a system-wide
    one last (``find_library`` runs a subprocess: only when the others fail)."""
    found = []
    try:  # Linux: the library h5py's extensions loaded, exactly
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                name = os.path.basename(path)
                if name.startswith("libhdf5") and "hdf5_hl" not in name:
                    found.append("/" + path)
    except OSError:
        pass
    here = os.path.dirname(h5py.__file__)
    for pattern in ("../h5py.libs/libhdf5-*", ".dylibs/libhdf5.*", "libhdf5*", "hdf5*.dll"):
        found += [p for p in glob.glob(os.path.join(here, pattern)) if "hdf5_hl" not in p]
    yield from dict.fromkeys(os.path.realpath(p) for p in found)
    system = ctypes.util.find_library("hdf5")
    if system:
        yield system


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the prototypes of the functions used."""
    lib.H5allocate_memory.restype = ctypes.c_void_p
    lib.H5allocate_memory.argtypes = [ctypes.c_size_t, ctypes.c_bool]
    lib.H5free_memory.restype = herr_t
    lib.H5free_memory.argtypes = [ctypes.c_void_p]
    lib.H5get_libversion.restype = herr_t
    lib.H5get_libversion.argtypes = [ctypes.POINTER(ctypes.c_uint)] * 3
    lib.H5Tget_class.restype = ctypes.c_int
    lib.H5Tget_class.argtypes = [hid_t]
    lib.H5Tget_size.restype = ctypes.c_size_t
    lib.H5Tget_size.argtypes = [hid_t]
    lib.H5Tget_order.restype = ctypes.c_int
    lib.H5Tget_order.argtypes = [hid_t]
    lib.H5Pget_chunk.restype = ctypes.c_int
    lib.H5Pget_chunk.argtypes = [hid_t, ctypes.c_int, ctypes.POINTER(hsize_t)]
    lib.H5Pget_filter_by_id2.restype = herr_t
    lib.H5Pget_filter_by_id2.argtypes = [
        hid_t,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_uint),
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_uint),
    ]
    lib.H5Pmodify_filter.restype = herr_t
    lib.H5Pmodify_filter.argtypes = [
        hid_t,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_uint),
    ]
    return lib


def _version(lib: ctypes.CDLL) -> tuple:
    v = [ctypes.c_uint() for _ in range(3)]
    lib.H5get_libversion(*[ctypes.byref(x) for x in v])
    return tuple(x.value for x in v)


def load_hdf5() -> ctypes.CDLL:
    """h5py's libhdf5 with the prototypes declared; raises OSError when none is found
    whose version is h5py's."""
    want = tuple(h5py.version.hdf5_version_tuple[:3])
    tried = []
    for path in _candidates():
        try:
            lib = _bind(ctypes.CDLL(path))
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        if _version(lib) == want:
            return lib
        tried.append(f"{path}: HDF5 {_version(lib)}, h5py uses {want}")
    raise OSError("the HDF5 library h5py uses was not found; tried " + "; ".join(tried or ["none"]))
