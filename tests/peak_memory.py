"""Peak resident memory of a child process, measured from a point it chooses.

``ru_maxrss`` cannot serve: Linux carries a process's high-water mark across exec, so a
script started by a large test worker reports the worker's peak, and a growth below it
does not show. ``VmHWM`` belongs to the new program; writing 5 to ``clear_refs`` resets
it to the current size. Scripts run in a subprocess paste :data:`CODE` at their top.
"""

CODE = '''
def reset_peak():
    """Start the high-water mark again from the current resident size."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes():
    """The most resident memory since the last reset (bytes)."""
    with open("/proc/self/status") as f:
        return next(int(v.split()[1]) * 1024 for v in f if v.startswith("VmHWM:"))
'''
