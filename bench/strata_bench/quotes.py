"""Checks the paper's words on docs/SEEDS.md against the seeds themselves:
in every "**The paper** (seed NNN: where)." paragraph, each phrase in
double quotes must appear in seed NNN's text word for word (case aside), and each
number outside them must appear in it as a number (a number marked ≈ is
derived, e.g. ≈0.33× from 60 and 180 MBps, and is not looked up).

    python3 -m strata_bench.quotes [docs/SEEDS.md] [SEEDS_DIR]

SEEDS_DIR defaults to ../shared/seeds beside the checkout; where the seed
texts are not at hand the check says so and passes (exit 0)."""
import os
import re
import sys

from .common import ROOT

SEEDS_DIR = os.path.join(ROOT, "..", "shared", "seeds")
_NUM = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?|\.\d+)")
_PARA = re.compile(r"^\*\*The paper\*\* \(seed (\d{3}): ([^\n]*?)\)\. (.*)$", re.M)


def _norm(text):
    """Whitespace collapsed and typographic quotes and dashes made plain."""
    for a, b in (("’", "'"), ("‘", "'"), ("“", '"'), ("”", '"'), ("–", "-"), ("—", "-"), ("\u00a0", " ")):
        text = text.replace(a, b)
    return re.sub(r"\s+", " ", text)


def _numbers(text):
    out = set()
    for m in _NUM.finditer(text):
        try:
            out.add(float(m.group(1).replace(",", "")))
        except ValueError:
            pass
    return out


def seed_texts(seeds_dir):
    """{"000": text, ...} from the seed files (named NNN_*.txt)."""
    out = {}
    for name in sorted(os.listdir(seeds_dir)):
        if re.match(r"\d{3}_.*\.txt$", name):
            with open(os.path.join(seeds_dir, name), errors="replace") as f:
                out[name[:3]] = f.read()
    return out


def check(page, seeds):
    """Problems with the quotes of PAGE (Markdown) against SEEDS ({id:
    text}), one sentence each; the number of paragraphs checked."""
    problems, n = [], 0
    for m in _PARA.finditer(page):
        sid, text = m.group(1), _norm(m.group(3))
        if sid not in seeds:
            problems.append(f"seed {sid}: no such seed text")
            continue
        n += 1
        seed = _norm(seeds[sid])
        seed_nums = _numbers(seed)
        quoted = re.findall(r'"([^"]+)"', text)
        for q in quoted:
            if q.strip().lower() not in seed.lower():
                problems.append(f"seed {sid}: \"{q}\" is not in the seed's text")
        bare = re.sub(r'"[^"]+"', " ", text)
        bare = re.sub(r"≈\s*\d[\d,.]*", " ", bare)
        for v in sorted(_numbers(bare)):
            if v not in seed_nums:
                problems.append(f"seed {sid}: the number {v:g} is not in the seed's text "
                                f"(in: {text[:80]}...)")
    return problems, n


def main(argv):
    page_path = argv[1] if len(argv) > 1 else os.path.join(ROOT, "docs", "SEEDS.md")
    seeds_dir = argv[2] if len(argv) > 2 else SEEDS_DIR
    if not os.path.isdir(seeds_dir):
        print(f"quotes: skipped: the seed texts are not at hand ({seeds_dir})")
        return 0
    with open(page_path) as f:
        page = f.read()
    problems, n = check(page, seed_texts(seeds_dir))
    for p in problems:
        print(p)
    print(f"quotes: {n} paragraphs of {page_path}, {len(problems)} problems")
    return 1 if problems or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
