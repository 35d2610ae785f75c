"""Word layout of the protocol as the FlyDSL half sees it (PLACEHOLDER until PROTOCOL.md)."""

PEER_HEAD_BYTES = 256
ALARM_WORD0 = 0
ALARM_STRIDE = 1
HEALTH_FLAG, HEALTH_REGION, HEALTH_PAIR, HEALTH_WANT, HEALTH_SEEN, HEALTH_PROGRAM = range(6)
HEALTH_TIME64 = 3
HEALTH_COUNT = 8


def device_tag(epoch, slot):
    return epoch * 256 + slot + 1
