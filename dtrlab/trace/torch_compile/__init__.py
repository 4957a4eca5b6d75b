"""torch.compile's capture: the joint graph, torch's partitioner per knob, Inductor's lowering, GPU targets."""
