"""Run the amqtt broker from a JSON config (the bench starts this as a subprocess).

Same as amqtt's own ``amqtt -c`` command (default asyncio loop), minus its per-connection INFO
logging, which would otherwise be part of what is measured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys


def main() -> None:
    from amqtt.broker import Broker

    logging.basicConfig(level=logging.WARNING)
    with open(sys.argv[1]) as f:
        config = json.load(f)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    broker = Broker(config, loop=loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def run() -> None:
        await broker.start()
        await stop.wait()
        try:
            await asyncio.wait_for(broker.shutdown(), 3)
        except (TimeoutError, Exception):  # noqa: BLE001 - exiting anyway
            pass

    loop.run_until_complete(run())


if __name__ == "__main__":
    main()
