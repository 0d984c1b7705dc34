"""Compile recorded kernel launches ahead of time for a CUDA target, without a GPU.

Run as a script (``python tests/ops/aot_compile.py < launches.json``) in a process where
``TRITON_INTERPRET`` is unset, so that the kernels are compilable ``JITFunction`` objects. Each
launch is ``{"kernel": "module:name", "args": {name: value}, "num_stages": n}`` where a
value is ``["ptr", dtype]``, ``["i32", value]``, ``["fp32", value]`` or ``["const", value]``
(a Triton dtype as ``["dtype", "fp32"]``). For each launch and each target capability it
prints, as one JSON list, the bytes of shared memory the compiled kernel needs and the
number of tensor-core products (``mma``/``warp_group_dot``) in its GPU IR. The compilation
stops after LLVM IR: shared memory is allocated by then, and ``ptxas`` (the slow step) is
not needed.
"""

from __future__ import annotations

import importlib
import json
import re
import sys

import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

_PTR = {"float32": "*fp32", "float64": "*fp64", "float16": "*fp16", "bfloat16": "*bf16"}


def _signature(fn: triton.JITFunction, args: dict) -> tuple[dict, dict]:
    """The signature (name → type string or ``constexpr``) and the constexpr values."""
    signature, constants = {}, {}
    for param in fn.params:
        kind, *value = args[param.name]
        if param.is_constexpr:
            const = value[0]
            if isinstance(const, list) and const[0] == "dtype":
                const = {"fp32": tl.float32, "fp64": tl.float64}[const[1]]
            signature[param.name], constants[param.name] = "constexpr", const
        else:
            signature[param.name] = _PTR[value[0]] if kind == "ptr" else kind
    return signature, constants


def compile_to_llir(launch: dict, capability: int) -> tuple[int, int]:
    """Shared-memory bytes and tensor-core products of one launch for ``sm_<capability>``."""
    module_name, name = launch["kernel"].split(":")
    fn = getattr(importlib.import_module(module_name), name)
    signature, constants = _signature(fn, launch["args"])
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    options = backend.parse_options({"num_stages": launch["num_stages"]})
    metadata = {"target": target, **options.__dict__}
    stages: dict = {}
    backend.add_stages(stages, options, source.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(
        target,
        options,
        backend.get_codegen_implementation(options),
        backend.get_module_map(),
        context,
    )
    products = 0
    for ext, run in stages.items():
        module = run(module, metadata)
        if ext == "ttgir":
            products = len(re.findall(r"warp_group_dot|ttng\.wgmma|nvidia_mma<", str(module)))
        if ext == "llir":
            break
    return int(metadata["shared"]), products


def main() -> None:
    """Read the launches and capabilities from stdin; print the results as JSON."""
    request = json.load(sys.stdin)
    results = [
        [compile_to_llir(launch, cap) for cap in request["capabilities"]]
        for launch in request["launches"]
    ]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
