"""The plan: profiles, identities, kernel sources, buffers, the launch lists and the reference model.

Launch lists: `launches` (the model, stage by stage; the API the host and the build tool use),
`launch_types` (argument kinds, Launch), `tuning` (meta-parameters), `launch_refs` (buffers by
name, per layer), `launch_matmul` and `launch_builders` (one builder per kernel).
"""
