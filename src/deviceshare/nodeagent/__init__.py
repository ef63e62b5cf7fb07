"""`deviceshare node-agent`: what a shared node's devices are, published on its Node (CONTRACT §9).

A DaemonSet runs one agent per shared node. It reads the GPUs through NVML (NVIDIA's ``nvidia-ml-py``,
imported only when used) or a device file (Intel and other vendors), watches XID errors, checks whether an
MPS control daemon serves the node, and writes the annotations ``deviceshare.io/devices``,
``device-memory``, ``device-topology``, ``device-health`` and ``mps`` when, and only when, they change.

Modules: :mod:`readings` (facts -> annotation values, pure), :mod:`nvmlsource` and :mod:`filesource`
(where facts come from), :mod:`xids` (health from XID events), :mod:`publishing` (every API call),
:mod:`agent` (the loop), :mod:`command` (flags and wiring), :mod:`metrics` (/metrics).
"""
