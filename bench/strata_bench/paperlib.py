"""What the figures of `make paper` share: reading a case's results
(with a path in every error), quantities with their runs (rules.Q),
tables, series and labels."""
from . import plot
from .common import size_bytes
from .report import _n
from .rules import Q

LABEL = {"thin": "strata thin", "native_delta": "strata linked clone",
         "seSparse": "strata SEsparse", "vmfsSparse": "strata VMFSsparse",
         "qemu_raw": "qemu-nbd raw", "qemu_vmfsSparse": "qemu-nbd VMFSsparse",
         "qemu_qcow2": "qemu-nbd qcow2 overlay", "native": "strata native",
         "qcow2": "qemu-nbd qcow2 chain", "vmdk": "strata VMDK chain",
         "qemu_vmdk": "qemu-nbd VMDK chain"}


class Missing(KeyError):
    pass


def _g(d, *path):
    """d[path...], with a KeyError naming the whole path."""
    cur = d
    for i, k in enumerate(path):
        if isinstance(cur, dict) and k in cur:
            cur = cur[k]
        elif isinstance(cur, dict) and str(k) in cur:
            cur = cur[str(k)]
        elif isinstance(cur, list) and isinstance(k, int) and k < len(cur):
            cur = cur[k]
        else:
            raise Missing(".".join(map(str, path[:i + 1])))
    return cur


# A value's runs, where a case kept them, sit beside it under one of these.
RUN_SUFFIXES = ("_runs", "_passes")


def _q(d, *path):
    """The quantity at PATH as a Q: its runs when the case kept them (KEY_runs
    or KEY_passes beside KEY), else the one value (n = 1)."""
    parent = _g(d, *path[:-1]) if len(path) > 1 else d
    key = path[-1]
    if isinstance(parent, dict):
        for suf in RUN_SUFFIXES:
            runs = parent.get(f"{key}{suf}")
            if runs:
                return Q.of(runs)
    return Q.of(_g(parent, key))


def _nq(q, nd=0):
    """A table cell: the median, and min-max when there were runs."""
    q = Q.of(q)
    s = _n(q.m, nd)
    if q.hi > q.lo:
        s += f" ({_n(q.lo, nd)}–{_n(q.hi, nd)})"
    return s


def _table(headers, rows):
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def _kib(bs):
    return size_bytes(bs.upper()) >> 10


def _series(i, name, points, dash=None, **kw):
    s = {"name": name, "points": points, "color": plot.PALETTE[i % len(plot.PALETTE)],
         "dash": plot.DASHES[i % len(plot.DASHES)] if dash is None else dash}
    s.update(kw)
    return s


def _keys_int(d):
    """The integer keys of D, in order (KEY_runs beside them left out)."""
    return sorted((k for k in d if str(k).lstrip("-").isdigit()), key=lambda k: int(k))
