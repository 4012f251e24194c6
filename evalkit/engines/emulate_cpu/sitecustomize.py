"""Put on the vLLM server's PYTHONPATH when EVALKIT_EMULATE_CPU=avx2: the server then takes the
kernel paths of an AVX2-only processor on a machine that has AVX-512 (vLLM picks its kernel
library and attention/GEMM paths from these torch.cpu probes; ATEN_CPU_CAPABILITY and
ONEDNN_MAX_CPU_ISA, set beside this, cap torch's and oneDNN's own dispatch). Clock speed, cache
sizes and memory bandwidth stay the real machine's, so this previews the code path, not the box.
"""

import os

if os.environ.get("EVALKIT_EMULATE_CPU") == "avx2":
    try:
        import torch.cpu as _cpu
    except ImportError:  # not the vLLM environment: nothing to cap
        _cpu = None
    if _cpu is not None:
        for _name in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
                      "_is_amx_tile_supported", "_is_amx_fp16_supported"):
            if hasattr(_cpu, _name):
                setattr(_cpu, _name, lambda: False)
