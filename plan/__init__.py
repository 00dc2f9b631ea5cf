"""The plan: profiles, identities, kernel sources, launch lists and the reference model."""
