"""SEE's gRPC face: the Experience servicer (`servicer`), the RunMetrics servicer
(`runmetrics`), which RPCs a scoped token may call (`access`), and the pure request checks the
servicers run before they call the store (`requests`)."""
