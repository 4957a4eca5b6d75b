"""torch.compile's capture: a training step's joint graph, torch's partitioner per knob, the step it makes.

A step goes through the files in this order:

1. ``tracing.py``: :func:`~.tracing.trace_joint` (a model source) or :func:`~.tracing.trace_step` (a live module)
   traces the step once on fake tensors; ``intercept.py`` stops torch.compile at its partition function (one
   graph; aot_eager's or Inductor's), ``graph_breaks.py`` follows a step with graph breaks graph by graph.
2. ``joint.py``: what comes out, a :class:`~.joint.JointGraph` (its links between graphs, its content hash).
   For a GPU, ``cuda_joint.py`` re-traces it on fake CUDA tensors under ``gpu_target.py``'s answers (no GPU).
3. ``partition.py``: :func:`~.partition.partition` calls torch's min-cut partitioner on a copy per knob.
4. ``record.py``: the partitioned graphs run node by node under the capture's recorder, as aot_eager runs
   them: the step as a trace. Or ``inductor.py``: each partition lowered by Inductor and its wrapper's
   allocations recorded, the lowered steps kept on disk by ``lowering_cache.py``.

Aside: ``fingerprint.py``, a live step's fingerprint without tracing (dtrlab.compile's cache key).
"""
