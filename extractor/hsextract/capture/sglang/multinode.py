"""A server larger than one node: SGLang's ``--nnodes``, ``--node-rank`` and ``--dist-init-addr``.

One SGLang server spans ``nnodes`` containers (on one or several Proxmox hosts): every node runs
``hsextract launch-sglang`` with the same config except ``node_rank`` (0 .. nnodes-1), and all of them
reach node 0 at ``dist_init_addr`` (``host:port``, a port free on node 0 for torch.distributed's
rendezvous). ``tp_size`` counts the GPUs of all nodes together (two nodes of 8 GPUs: ``tp_size: 16``).

Where the data goes: node 0 holds tensor-parallel rank 0, which serves HTTP (``/generate``,
``/health_generate``) and is the only rank whose dump hook writes (``hook.is_writer_rank``), so the
dumps land in node 0's ``dump_dir`` (its ``/dev/shm``) and the extractor runs on node 0, against its
port. Nodes 1.. serve no HTTP and dump nothing.
"""

from __future__ import annotations

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.errors import ConfigError

#: flags this module sets from the config (the launcher refuses them in extra_args)
OWNED_FLAGS = {"--nnodes": "nnodes", "--node-rank": "node_rank", "--dist-init-addr": "dist_init_addr"}


def parse_dist_init_addr(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``; ConfigError naming the fix otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"dist_init_addr {value!r} is not host:port; set it to node 0's address and a free port, e.g. 10.0.0.11:29500"
        )
    return host, int(port)


def multinode_args(config: SGLangLaunchConfig) -> list[str]:
    """The multi-node flags for this node ([] for one node); refuses settings SGLang would hang on."""
    if config.nnodes == 1:
        if config.node_rank != 0:
            raise ConfigError(f"node_rank {config.node_rank} with nnodes 1: set nnodes to the number of nodes")
        return []
    if not 0 <= config.node_rank < config.nnodes:
        raise ConfigError(f"node_rank {config.node_rank} must be in 0..{config.nnodes - 1} (nnodes {config.nnodes})")
    if config.dist_init_addr is None:
        raise ConfigError(
            f"nnodes {config.nnodes} needs dist_init_addr: node 0's address and a free port (host:port) that every "
            "node reaches; without it each node waits for the others forever"
        )
    parse_dist_init_addr(config.dist_init_addr)
    if config.tp_size % config.nnodes:
        raise ConfigError(
            f"tp_size {config.tp_size} does not split over nnodes {config.nnodes}: tp_size counts the GPUs of all "
            f"nodes together (e.g. 2 nodes x 8 GPUs: tp_size 16)"
        )
    if config.enable_dp_attention:
        raise ConfigError(
            "enable_dp_attention with nnodes > 1: each attention group's rank 0 would dump on its own node, away "
            "from the extractor; use plain tensor parallelism across nodes"
        )
    return [
        "--nnodes", str(config.nnodes),
        "--node-rank", str(config.node_rank),
        "--dist-init-addr", config.dist_init_addr,
    ]  # fmt: skip
