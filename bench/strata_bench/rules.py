"""The verdict rules of docs/SEEDS.md: one function per kind of claim, so
that every verdict on the page comes from a rule written once, stated in
the page's legend (LEGEND) and tested on both sides of its threshold
(bench/strata_bench/test_rules.py).

A measured quantity is a Q: the median of its runs and their minimum and
maximum. Ratios of Qs carry the worst-case range (interval arithmetic on
positive numbers), so a ratio of two noisy cells is as uncertain as both.
A difference is claimed only when it is both material (more than
MATERIAL away from parity, by the median) and beyond the spread (the
ratio's whole range lies on one side of parity); anything else is "within
noise". A quantity measured once has no spread: only materiality applies,
and the page shows n = 1 beside it."""
import math
from statistics import median

# The smallest difference the page calls a difference, as a share of the
# reference (10 %: below it, runs on this machine differ by as much).
MATERIAL = 0.10

# The classes a verdict can take, in the words the page uses.
REMOVES = "removes the cause"
REPRODUCES = "reproduces"
REPRODUCES_EFFECT = "reproduces the effect"
IN_PART = "reproduces in part"
BEATS = "beats"
NOT_REPRODUCED = "does not reproduce"
NOISE = "within noise"
NOT_APPLICABLE = "not applicable at the host layer"

LEGEND = [
    ("difference", "A and B differ only when the median ratio A/B is more than "
     f"{MATERIAL:.0%} from 1 and the ratio's whole range (from the runs' minima and maxima) "
     "lies on the same side of 1; otherwise they are level, \"within noise\"."),
    ("cost", "A cost the paper measured (a system with its cause against the same system "
     "without): **removes the cause** when strata shows no cost by the difference rule and "
     f"its median keeps at least {1 - MATERIAL:.0%}; **within noise** when the median shows a "
     "cost the spread cannot confirm; **reproduces in part** when it shows one smaller than the "
     "paper's; **reproduces the effect** when it is as large or larger."),
    ("no effect", "Where the paper found no effect (\"very little\", \"only slightly\", "
     "\"virtually no\"): **reproduces** when strata's two sides are level by the difference "
     f"rule and their median ratio within {MATERIAL:.0%} of 1; **within noise** when the median "
     "differs more but the spread cannot confirm it; **does not reproduce** otherwise."),
    ("ranking", "Where the paper ranks two systems (A ahead of B by a factor): **reproduces** "
     "when A is ahead by the difference rule and by at least the paper's factor (less "
     f"{MATERIAL:.0%}), **reproduces in part** when ahead by less, **within noise** when level, "
     "**does not reproduce** when behind."),
    ("host layer", "Where a figure is the guest file system's own (its fragments, its I/O "
     "sizes): **not applicable at the host layer** when the guest's I/O is unchanged by "
     "strata (counted, so exact), and the nearest host-layer quantity is measured beside it."),
    ("function", "A capability the paper shows without a measurement (over-commit, counters): "
     "**reproduces** when every condition listed in the verdict holds, **does not "
     "reproduce** otherwise."),
]


class Q:
    """A measured quantity: median m and range [lo, hi] over n runs."""
    __slots__ = ("m", "lo", "hi", "n")

    def __init__(self, m, lo=None, hi=None, n=1):
        self.m = float(m)
        self.lo = self.m if lo is None else float(lo)
        self.hi = self.m if hi is None else float(hi)
        self.n = n

    @classmethod
    def of(cls, x):
        """A Q from a number, a list of runs, or a Q."""
        if isinstance(x, Q):
            return x
        if isinstance(x, (list, tuple)):
            xs = [float(v) for v in x if v is not None]
            if not xs:
                raise ValueError("no runs")
            return cls(median(xs), min(xs), max(xs), len(xs))
        return cls(x)

    def __truediv__(self, o):
        o = Q.of(o)
        if o.m == 0 or o.lo <= 0:
            raise ZeroDivisionError("ratio to a quantity that reaches zero")
        return Q(self.m / o.m, self.lo / o.hi, self.hi / o.lo, min(self.n, o.n))

    def __mul__(self, o):
        o = Q.of(o)
        return Q(self.m * o.m, self.lo * o.lo, self.hi * o.hi, min(self.n, o.n))

    def fmt(self, nd=2, unit="×"):
        s = f"{self.m:.{nd}f}{unit}"
        if self.hi > self.lo:
            s += f" ({self.lo:.{nd}f}–{self.hi:.{nd}f})"
        return s

    def __repr__(self):
        return f"Q({self.m:g}, {self.lo:g}, {self.hi:g}, n={self.n})"


def gmean(qs):
    """Geometric mean of Qs, componentwise (the range stays worst-case)."""
    qs = [Q.of(q) for q in qs if q is not None]
    qs = [q for q in qs if q.lo > 0]
    if not qs:
        raise ValueError("no positive quantities")

    def g(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))
    return Q(g([q.m for q in qs]), g([q.lo for q in qs]), g([q.hi for q in qs]), min(q.n for q in qs))


def qmedian(qs):
    """The median of Qs, componentwise."""
    qs = [Q.of(q) for q in qs]
    return Q(median(q.m for q in qs), median(q.lo for q in qs), median(q.hi for q in qs),
             min(q.n for q in qs))


def difference(r):
    """The difference rule on a ratio A/B: 'higher', 'lower' or 'level'."""
    r = Q.of(r)
    if r.m > 1 + MATERIAL and r.lo > 1:
        return "higher"
    if r.m < 1 - MATERIAL and r.hi < 1:
        return "lower"
    return "level"


def cost(keep, paper_keep):
    """The cost rule. KEEP: what strata keeps with the cause present
    against without (a ratio, 1 = no cost); PAPER_KEEP: what the paper's
    worst system kept. Returns the class."""
    keep = Q.of(keep)
    d = difference(keep)
    if d == "level" and keep.m < 1 - MATERIAL:
        # A cost by the median that the spread cannot confirm: no claim.
        return NOISE
    if d != "lower":
        return REMOVES
    if paper_keep is not None and keep.m > paper_keep * (1 + MATERIAL):
        return IN_PART
    return REPRODUCES_EFFECT


def no_effect(r):
    """The no-effect rule on a ratio of the two sides the paper found level."""
    r = Q.of(r)
    if difference(r) != "level":
        return NOT_REPRODUCED
    return REPRODUCES if abs(r.m - 1) <= MATERIAL else NOISE


def ranking(r, paper_factor):
    """The ranking rule. R: A/B here (higher is A ahead); PAPER_FACTOR: the
    paper's A/B (> 1)."""
    d = difference(r)
    if d == "level":
        return NOISE
    if d == "lower":
        return NOT_REPRODUCED
    return REPRODUCES if Q.of(r).m >= paper_factor * (1 - MATERIAL) else IN_PART


def host_layer(before, after):
    """The host-layer rule on a count of the guest's own I/O (exact)
    before and after a host operation."""
    return NOT_APPLICABLE if before == after else REPRODUCES


def function(conditions):
    """The function rule: CONDITIONS is [(words, bool)]; returns the class
    and the words of those that failed."""
    failed = [w for w, ok in conditions if not ok]
    return (REPRODUCES if not failed else NOT_REPRODUCED), failed


def word(d, higher="faster", lower="slower", level="level within noise"):
    """The difference rule's outcome in words."""
    return {"higher": higher, "lower": lower, "level": level}[d]
