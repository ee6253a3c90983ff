"""Runs on a lab node with the unmodified pynvml: lists the GPUs, registers for XID events,
touches a marker file once registered, then prints one JSON line per received event."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pynvml

marker = Path(sys.argv[1])
wait_seconds = float(sys.argv[2])

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
gpus = [
    {
        "index": i,
        "name": pynvml.nvmlDeviceGetName(h),
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "pci": pynvml.nvmlDeviceGetPciInfo(h).busId,
    }
    for i, h in enumerate(handles)
]
print(json.dumps({"gpus": gpus}), flush=True)
event_set = pynvml.nvmlEventSetCreate()
for h in handles:
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
marker.touch()
deadline = time.monotonic() + wait_seconds
while time.monotonic() < deadline:
    try:
        data = pynvml.nvmlEventSetWait(event_set, 100)
    except pynvml.NVMLError_Timeout:
        continue
    index = pynvml.nvmlDeviceGetIndex(data.device)
    print(json.dumps({"xid": data.eventData, "gpu": index, "at": time.time()}), flush=True)
    break
pynvml.nvmlEventSetFree(event_set)
pynvml.nvmlShutdown()
