"""``train doctor``: check the GPU setup and estimate training memory before a job starts.

What it reports: torch / CUDA / cuDNN / NCCL / driver versions; each GPU's name,
compute capability, memory, FP8 and MXFP8 support (``train.hardware``); the CUDA
peer-access matrix and the NVLink/PCIe topology from ``nvidia-smi topo -m``; whether
torchao (and its C++ extensions) and Transformer Engine import; and a per-GPU memory
estimate for a model preset under DDP, FSDP2 and TP, with and without activation
checkpointing, with the layout and micro-batch it recommends for the GPUs it sees or
for a hardware profile (``--profile``).

Modules, lowest first:

* ``cuda_compat`` (+ ``cuda_driver.yaml``): does this driver run this CUDA;
* ``probes``: nvidia-smi (GPUs, topology), NCCL self-test;
* ``libraries``: torchao / Transformer Engine import checks;
* ``system``: the system report (:func:`train.doctor.system.collect_system`);
* ``profiles``: hardware profiles, read through ``core.catalog``;
* ``memory`` (the per-GPU memory model), ``planning`` (layout and batch that fit),
  ``memreport`` (the report's memory section, ``--measure``);
* ``render``: the text report; ``cli``: the ``train doctor`` command.

Exit status: 0 when nothing is wrong (a CPU-only machine included: it says so),
1 when a real problem was found (each one printed with its reason), 2 for usage errors.
Importing any of these modules is cheap: torch is imported only when the command runs.
"""
