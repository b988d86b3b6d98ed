"""`mutualrl experiment`: the probe comparison (none / prp / xgrpo / sgt) over paired seeds."""
