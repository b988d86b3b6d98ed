"""What crosses between the policies: the peer exchange (SEE, THL) and the sharing probes."""
