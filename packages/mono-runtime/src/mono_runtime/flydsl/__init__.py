"""The FlyDSL (AMD gfx950 / gfx942) half of mono's device protocol, and the tools to build it.

Importing this package needs no FlyDSL: the device helpers live in ``protocol`` (which
imports ``flydsl``), while ``toolchain``, ``offline``, ``isa`` and ``residency`` run
anywhere, so a CPU machine can compile for gfx950 in a subprocess and check the ISA.
"""
