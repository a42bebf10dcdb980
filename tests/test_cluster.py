"""kvsched.cluster without Ray: the serial executor's order, stop and progress, and the
address check that refuses a bad --ray-address in one line before Ray is touched."""

from __future__ import annotations

import socket
from collections.abc import Callable
from functools import partial

import pytest

from kvsched.cluster import ClusterError, Serial, check_address, executor


def square(n: int) -> int:
    return n * n


def test_serial_runs_in_order_and_stops_after_the_first_that_satisfies_stop() -> None:
    pieces: list[Callable[[], int]] = [partial(square, n) for n in range(6)]
    done: list[int] = []
    outcomes = list(Serial().run(pieces, stop=lambda v: v > 5, on_done=done.append))
    assert [(o.index, o.value, o.lost) for o in outcomes] == [
        (0, 0, None), (1, 1, None), (2, 4, None), (3, 9, None)]
    assert done == [0, 1, 2, 3]


def test_without_ray_options_the_executor_is_serial() -> None:
    with executor(use_ray=False, workers=None, address=None) as ex:
        assert isinstance(ex, Serial) and not ex.distributed


@pytest.mark.parametrize("address", ["nohost", "host:", "host:port", "http://h:1/x",
                                     "h:1/path", "h:70000", ""])
def test_a_malformed_address_is_refused(address: str) -> None:
    with pytest.raises(ClusterError, match=r"expected HOST:PORT .*, ray://HOST:PORT or auto$"):
        check_address(address)


def test_an_address_where_nothing_listens_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    with pytest.raises(ClusterError, match=f"^--ray-address 127.0.0.1:{port}: no Ray "
                                           r"cluster answers there \(Connection refused\)$"):
        check_address(f"127.0.0.1:{port}")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_address(f"127.0.0.1:{listening.getsockname()[1]}")
        check_address(f"ray://127.0.0.1:{listening.getsockname()[1]}")
    check_address("auto")
