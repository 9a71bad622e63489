"""Beyond one machine: per-node agents that run process children for the head's supervisors.

- `addresses`: this node's address and the socket-interface environment that makes gloo,
  NCCL and TensorPipe use it;
- `agent`: the `slime-async agent` program (one per node but the head);
- `head`: the head's end: agents register there, and `RemoteProcessChild` is the actor that
  stands for a process an agent runs;
- `nodes`: where a child runs (`LocalNode` or `AgentNode`) and the run's `Cluster`;
- `wire`: the messages between head and agent; `shared_dir`: the probe that tells whether
  nodes share a directory (the disk weight transport's export directory).
"""
