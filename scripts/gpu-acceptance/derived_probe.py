"""Device side: what SGLang's own ServerArgs derives on this GPU when the attention backend and
page size are left unset, for a plain server, EAGLE3 with topk 1 and 4, and DFLASH (the model
directory of the acceptance run). One JSON line per case: the settings given, then the derived
attention_backend, prefill/decode backends and page_size, or the error SGLang raised.
Usage: derived_probe.py MODELS_DIR"""

from __future__ import annotations

import json
import sys
import traceback

M = sys.argv[1]
CASES = {
    "none": {},
    "eagle3_topk1": {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": f"{M}/tiny-eagle3",
                     "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
    "eagle3_topk4": {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": f"{M}/tiny-eagle3",
                     "speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
    "dflash": {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": f"{M}/tiny-dflash"},
}
from sglang.srt.server_args import ServerArgs  # noqa: E402

for name, extra in CASES.items():
    try:
        a = ServerArgs(model_path=f"{M}/tiny-llama", load_format="dummy", **extra)
        got = {k: getattr(a, k, None) for k in ("attention_backend", "prefill_attention_backend",
                                                "decode_attention_backend", "page_size")}
        print(json.dumps({"case": name, "given": extra, "derived": got}), flush=True)
    except Exception as exc:  # the case's answer is what SGLang raised
        print(json.dumps({"case": name, "given": extra, "error": f"{type(exc).__name__}: {exc}",
                          "where": traceback.format_exc().splitlines()[-3:]}), flush=True)
