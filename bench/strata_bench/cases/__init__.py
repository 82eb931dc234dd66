"""The cases, one module each, and their registry: CASES maps a case's name
(what --only takes) to a function (work directory, quick) -> the case's
entry in results.json. A run without --only takes them in this order."""
from .backup import case_backup
from .groupsnap import case_groupsnap
from .hostile import case_hostile
from .bigread import case_bigread
from .cachenone import case_cachenone
from .chain import case_chain
from .ckpt import case_ckpt
from .claims import case_claims
from .clone import case_clone
from .crypto import case_crypto
from .depth import case_depth
from .firstwrite import case_firstwrite
from .formats import case_formats
from .fragmentation import case_fragmentation
from .manydisks import case_manydisks
from .matrix import case_matrix
from .move import case_move
from .multihost import case_compaction, case_multihost
from .queues import case_queues
from .reclaim import case_reclaim
from .rss import case_rss
from .simple import case_simple
from .snaptime import case_snaptime
from .space import case_space
from .spacework import case_spacework
from .stats import case_stats
from .tls import case_tls
from .vdi import case_vdi
from .vhost import case_vhost
from .zerodetect import case_zerodetect
from .zeroing import case_zeroing
from .paper_matrix import case_paper_matrix
from .snapchain import case_snapchain
from .tera import case_tera
from .thinprov import case_thinprov
from .timeline import case_timeline

CASES = {
    "depth": case_depth,
    "randwrite": lambda w, q: case_simple(w, q, "randwrite", "4k", False, ">= 1.0"),
    "randread": lambda w, q: case_simple(w, q, "randread", "4k", True, ">= 0.95"),
    "seqwrite": lambda w, q: case_simple(w, q, "write", "512k", False, ">= 0.9", iodepth=8),
    "snaptime": case_snaptime,
    "rss": case_rss,
    "stats": case_stats,
    "ckpt": case_ckpt,
    "reclaim": case_reclaim,
    "spacework": case_spacework,
    "bigread": case_bigread,
    "zeroing": case_zeroing,
    "zerodetect": case_zerodetect,
    "matrix": case_matrix,
    "chain": case_chain,
    "clone": case_clone,
    "formats": case_formats,
    "vdi": case_vdi,
    "fragmentation": case_fragmentation,
    "vhost": case_vhost,
    "cachenone": case_cachenone,
    "queues": case_queues,
    "manydisks": case_manydisks,
    "multihost": case_multihost,
    "compaction": case_compaction,
    "move": case_move,
    "claims": case_claims,
    "backup": case_backup,
    "groupsnap": case_groupsnap,
    "tls": case_tls,
    "hostile": case_hostile,
    "firstwrite": case_firstwrite,
    "crypto": case_crypto,
    "space": case_space,
    # make paper's own (bench.py --paper): not in a run without --only.
    "paper_matrix": case_paper_matrix,
    "tera": case_tera,
    "thinprov": case_thinprov,
    "snapchain": case_snapchain,
    "timeline": case_timeline,
}

# Cases only `make paper` runs (bench.py --paper) unless --only names them.
PAPER_ONLY = {"paper_matrix", "tera", "thinprov", "snapchain", "timeline"}
