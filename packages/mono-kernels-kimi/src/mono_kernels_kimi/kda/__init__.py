"""K1: one Kimi-K3 KDA layer, from its AttnRes inputs to o_proj's input, in one launch."""
