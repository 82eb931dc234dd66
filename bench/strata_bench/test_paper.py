"""Tests of the seeds page's machinery (python3 -m unittest
strata_bench.test_paper, from bench/; make test runs them through
crates/cli/tests/bench_quick.rs): every verdict rule flips on either side
of its threshold, figures take their class from the rules, the quote
check finds misquotes, and the SVG check finds what cannot be read."""
import copy
import json
import os
import tempfile
import unittest

from . import plot, quotes, rules, svgcheck
from .common import ROOT
from .paper import FIGURES, render_paper, verdict_class
from .rules import Q


class Rules(unittest.TestCase):
    def test_difference_needs_materiality_and_spread(self):
        self.assertEqual(rules.difference(Q(1.2)), "higher")
        self.assertEqual(rules.difference(Q(1.05)), "level")
        self.assertEqual(rules.difference(Q(0.85)), "lower")
        self.assertEqual(rules.difference(Q(0.95)), "level")
        # Material by the median, but the runs' range crosses parity.
        self.assertEqual(rules.difference(Q(0.8, 0.6, 1.1, 3)), "level")
        self.assertEqual(rules.difference(Q(0.8, 0.6, 0.95, 3)), "lower")
        self.assertEqual(rules.difference(Q(1.3, 0.9, 1.6, 3)), "level")
        self.assertEqual(rules.difference(Q(1.3, 1.05, 1.6, 3)), "higher")

    def test_ratio_carries_both_ranges(self):
        r = Q.of([9, 10, 11]) / Q.of([4, 5, 6])
        self.assertAlmostEqual(r.m, 2.0)
        self.assertAlmostEqual(r.lo, 9 / 6)
        self.assertAlmostEqual(r.hi, 11 / 4)

    def test_cost(self):
        self.assertEqual(rules.cost(Q(0.95), 0.35), rules.REMOVES)
        self.assertEqual(rules.cost(Q(0.6), 0.35), rules.IN_PART)
        self.assertEqual(rules.cost(Q(0.36), 0.35), rules.REPRODUCES_EFFECT)
        self.assertEqual(rules.cost(Q(0.3), 0.35), rules.REPRODUCES_EFFECT)
        self.assertEqual(rules.cost(Q(0.6), None), rules.REPRODUCES_EFFECT)
        # A cost inside the spread is no cost when the median is level too;
        # a median cost the spread cannot confirm is no claim either way.
        self.assertEqual(rules.cost(Q(0.95, 0.7, 1.2, 3), 0.35), rules.REMOVES)
        self.assertEqual(rules.cost(Q(0.6, 0.4, 1.2, 3), 0.35), rules.NOISE)

    def test_no_effect(self):
        self.assertEqual(rules.no_effect(Q(1.02)), rules.REPRODUCES)
        self.assertEqual(rules.no_effect(Q(0.7)), rules.NOT_REPRODUCED)
        self.assertEqual(rules.no_effect(Q(1.4)), rules.NOT_REPRODUCED)
        self.assertEqual(rules.no_effect(Q(1.05, 0.8, 1.3, 3)), rules.REPRODUCES)
        self.assertEqual(rules.no_effect(Q(1.4, 0.9, 1.9, 3)), rules.NOISE)

    def test_ranking(self):
        self.assertEqual(rules.ranking(Q(2.1), 2.0), rules.REPRODUCES)
        self.assertEqual(rules.ranking(Q(1.3), 2.0), rules.IN_PART)
        self.assertEqual(rules.ranking(Q(1.0), 2.0), rules.NOISE)
        self.assertEqual(rules.ranking(Q(0.6), 2.0), rules.NOT_REPRODUCED)

    def test_host_layer(self):
        self.assertEqual(rules.host_layer(6144, 6144), rules.NOT_APPLICABLE)
        self.assertEqual(rules.host_layer({"a": 1}, {"a": 1}), rules.NOT_APPLICABLE)
        self.assertEqual(rules.host_layer(6144, 5000), rules.REPRODUCES)

    def test_function(self):
        self.assertEqual(rules.function([("a", True), ("b", True)]), (rules.REPRODUCES, []))
        self.assertEqual(rules.function([("a", True), ("b", False)]), (rules.NOT_REPRODUCED, ["b"]))


def _paper_json():
    with open(os.path.join(ROOT, "bench", "paper.json")) as f:
        return json.load(f)


def _classes(results):
    with tempfile.TemporaryDirectory() as d:
        done = render_paper(results, os.path.join(d, "SEEDS.md"), partial=True)
    return {fid: v["verdict"] for fid, v in done.items()}


class Figures(unittest.TestCase):
    """A figure's class follows its data: the committed bench/paper.json,
    then the same with one quantity pushed across its rule's threshold."""

    @classmethod
    def setUpClass(cls):
        cls.base = _paper_json()
        cls.classes = _classes(cls.base)

    def test_every_figure_has_a_class(self):
        self.assertEqual(set(self.classes), {f[0] for f in FIGURES})
        for fid, c in self.classes.items():
            self.assertNotEqual(c, "no data", fid)

    def test_snapshot_cost_flips(self):
        res = copy.deepcopy(self.base)
        g = res["cases"]["snapchain"]["native"]["growing"]
        for d in g:
            if d != "0":
                g[d]["randrw_4k"]["iops"] = g["0"]["randrw_4k"]["iops"] * 0.3
                g[d]["randrw_4k"].pop("iops_runs", None)
        self.assertEqual(_classes(res)["002-f1"], rules.REPRODUCES_EFFECT)
        for d in g:
            g[d]["randrw_4k"]["iops"] = g["0"]["randrw_4k"]["iops"]
        self.assertEqual(_classes(res)["002-f1"], rules.REMOVES)

    def test_neighbour_flips(self):
        res = copy.deepcopy(self.base)
        c = res["cases"]["thinprov"]["coexist"]
        # The runs, where recorded, carry the figure (the median beside them).
        runs = c.get("beside_rewrites_mib_s_runs", [c["beside_rewrites_mib_s"]])
        for scale, want in ((1.0, rules.REPRODUCES), (0.5, rules.NOT_REPRODUCED)):
            c["beside_growth_mib_s"] = c["beside_rewrites_mib_s"] * scale
            c["beside_growth_mib_s_runs"] = [x * scale for x in runs]
            self.assertEqual(_classes(res)["001-f7"], want)

    def test_host_layer_flips(self):
        res = copy.deepcopy(self.base)
        f = res["cases"]["fragmentation"]
        f["frag_after"]["seqread_1m"]["commands"] = f["frag_before"]["seqread_1m"]["commands"]
        f["frag_after"]["copy_64k"]["commands"] = f["frag_before"]["copy_64k"]["commands"]
        self.assertEqual(_classes(res)["004-t3"], rules.NOT_APPLICABLE)
        f["frag_after"]["seqread_1m"]["commands"] //= 2
        self.assertEqual(_classes(res)["004-t3"], rules.REPRODUCES)

    def test_verdict_class_is_the_opening_words(self):
        self.assertEqual(verdict_class("removes the cause: a, b. c: d"), "removes the cause")
        self.assertEqual(verdict_class("reproduces the effect; x reproduces. y: z"),
                         "reproduces the effect; x reproduces")


class Quotes(unittest.TestCase):
    SEED = {"004": "the PerfectDisk disk reduced by 48.7% the total number of IO taking more "
                   "than 15ms, and 51.3% remained;\nAbout 290MB per iteration"}

    def test_finds_misquotes(self):
        ok = '**The paper** (seed 004: Table 8). I/Os over 15 ms fall by "48.7%" (about 290MB).\n'
        self.assertEqual(quotes.check(ok, self.SEED), ([], 1))
        bad = '**The paper** (seed 004: Table 8). I/Os over 15 ms fall by "46.7%".\n'
        problems, _ = quotes.check(bad, self.SEED)
        self.assertEqual(len(problems), 1, problems)
        bare = "**The paper** (seed 004: Table 8). I/Os over 15 ms fall by 46.7 %.\n"
        problems, _ = quotes.check(bare, self.SEED)
        self.assertEqual(len(problems), 1, problems)
        derived = "**The paper** (seed 004: Table 8). About ≈2× fewer.\n"
        self.assertEqual(quotes.check(derived, self.SEED), ([], 1))

    def test_the_page(self):
        if not os.path.isdir(quotes.SEEDS_DIR):
            print(f"skipped: the seed texts are not at hand ({quotes.SEEDS_DIR})")
            return
        with open(os.path.join(ROOT, "docs", "SEEDS.md")) as f:
            problems, n = quotes.check(f.read(), quotes.seed_texts(quotes.SEEDS_DIR))
        self.assertEqual(problems, [])
        self.assertEqual(n, len(FIGURES))


class Plots(unittest.TestCase):
    def setUp(self):
        if not svgcheck.chromium():
            if os.environ.get("STRATA_REQUIRE_TOOLS") == "1":
                self.fail("no chromium (scripts/install-deps.sh installs it)")
            self.skipTest("no chromium")

    def test_finds_overlaps_and_clipping(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "bad.svg")
            with open(p, "w") as f:
                f.write('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">'
                        '<text x="10" y="50" font-size="12">overlapping words</text>'
                        '<text x="30" y="52" font-size="12">more words</text>'
                        '<text x="190" y="20" font-size="12">clipped</text></svg>')
            found = svgcheck.problems(svgcheck.boxes([p]))
        self.assertTrue(any("overlaps" in x for x in found), found)
        self.assertTrue(any("'clipped' lies outside" in x for x in found), found)

    def test_charts_with_long_labels_and_negatives_are_readable(self):
        with tempfile.TemporaryDirectory() as d:
            bar = os.path.join(d, "bar.svg")
            plot.bar_chart(bar, "a chart", "% lost", ["eagerzeroedthick", "qemu_raw_falloc", "thin",
                                                      "zeroedthick", "qemu_raw_full", "a b c d e f"],
                           ["series one", "series two", "series three", "series four"],
                           [[-40, 12.5, 3, -7], [20, -1, 0.5, 8]] * 3,
                           errors=[[(-45, -35), None, (2, 4), None], [None] * 4] * 3)
            line = os.path.join(d, "line.svg")
            ser = [{"name": f"a long series name {i}", "points": [(x, x * i) for x in range(5)]}
                   for i in range(7)]
            ser.append({"name": "share", "points": [(x, 20 * x) for x in range(5)], "axis": 2})
            plot.line_chart(line, "a line chart with a title long enough to need a smaller font "
                            "than the default", [{"title": "p", "xlabel": "x", "ylabel": "y",
                                                  "series": ser, "y2label": "%", "y2max": 100}] * 2)
            found = svgcheck.problems(svgcheck.boxes([bar, line]))
        self.assertEqual(found, [])


if __name__ == "__main__":
    unittest.main()
