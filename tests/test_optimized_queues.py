"""The optimized scheduler's waiting queues and free list against plain Python models:
a sorted list for the priority buckets, a deque for the fcfs queue and the free list."""

from __future__ import annotations

from collections import deque

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvsched.optimized.blocks import BlockTable, FreeList
from kvsched.optimized.queues import FcfsQueue, PriorityQueue, SlotQueue

torch.set_num_threads(1)
CPU = torch.device("cpu")
I64 = torch.int64


def tensor(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=I64)


@given(keys=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10_000)), unique_by=lambda k: k[1],
                     max_size=60))
def test_insert_sorted_keeps_arrival_then_seq_order(keys: list[tuple[int, int]]) -> None:
    q = SlotQueue(CPU, capacity=4)
    for slot, (arrival, seq) in enumerate(keys):
        q.insert_sorted(slot, seq, arrival)
    expected = sorted((arrival, seq) for arrival, seq in keys)
    got = [(int(q.arrival[q.head + i]), int(q.seq[q.head + i])) for i in range(len(q))]
    assert got == expected


@given(ops=st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(-1, 2), st.integers(0, 3)),
    st.tuples(st.just("victim"), st.integers(0, 30), st.integers(0, 0)),
    st.tuples(st.just("leave"), st.integers(0, 30), st.integers(0, 0)),
    st.tuples(st.just("admit"), st.integers(1, 6), st.integers(0, 0))), max_size=60),
    priority=st.booleans())
def test_queues_give_the_valid_head_in_policy_order(ops: list[tuple[str, int, int]],
                                                    priority: bool) -> None:
    """Arrivals, victims going back, requests leaving in the middle (stale entries) and
    admissions from the head, against a model that sorts the waiting requests."""
    capacity = 64
    status = torch.full((capacity,), 3, dtype=I64)  # 0 = waiting
    seqs = torch.full((capacity,), -1, dtype=I64)
    keys: dict[int, tuple[int, int, int]] = {}  # slot -> (priority, arrival, seq)
    waiting: list[int] = []  # fcfs model: slots in queue order
    queue: FcfsQueue | PriorityQueue = PriorityQueue(CPU) if priority else FcfsQueue(CPU)
    seq = 0
    step = 0
    admitted: list[int] = []
    for op, a, b in ops:
        if op == "arrive" and len(keys) < capacity:
            slot = next(s for s in range(capacity) if s not in keys and s not in admitted)
            keys[slot] = (a, step + b, seq)
            status[slot], seqs[slot] = 0, seq
            queue.push_arrivals(tensor([slot]), tensor([seq]), [a], tensor([step + b]),
                                [step + b], [seq])
            waiting.append(slot)
            seq += 1
            step += 1
        elif op == "victim" and admitted:
            slot = admitted.pop(a % len(admitted))
            p, arrival, s = keys[slot]
            status[slot] = 0
            queue.push_victims(tensor([slot]), tensor([s]), [p], tensor([arrival]))
            waiting.insert(0, slot)
        elif op == "leave" and waiting:
            slot = waiting.pop(a % len(waiting))
            status[slot], seqs[slot] = 3, -1
            del keys[slot]
        elif op == "admit" and waiting:
            order = (sorted(waiting, key=lambda s: keys[s]) if priority else list(waiting))
            peek = queue.peek(a, status, seqs, 0)
            assert peek.slots.tolist() == order[:a]
            take = len(order[:a])
            queue.pop(peek, take)
            for slot in order[:take]:
                waiting.remove(slot)
                status[slot] = 1
                admitted.append(slot)
    order = sorted(waiting, key=lambda s: keys[s]) if priority else waiting
    assert queue.peek(capacity, status, seqs, 0).slots.tolist() == order


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40))
def test_free_list_is_a_fifo_of_block_ids(ops: list[tuple[bool, int]]) -> None:
    free = FreeList(12, CPU)
    model = deque(range(12))
    held: list[int] = []
    for take, count in ops:
        if take:
            count = min(count, len(model))
            got = free.take(count).tolist()
            assert got == [model.popleft() for _ in range(count)]
            held += got
        else:
            back, held = held[:count], held[count:]
            free.put(tensor(back[::-1]))
            model.extend(back[::-1])
        assert free.snapshot() == list(model) and free.count == len(model)


def test_block_table_rows_read_back_forwards_and_in_release_order() -> None:
    table = BlockTable(max_cols=3000, device=CPU)
    rows = table.lend(3)
    table.write(rows, tensor([0, 0, 0]), tensor([2, 0, 3]), tensor([5, 6, 7, 8, 9]))
    table.write(rows[:1], tensor([2]), tensor([1]), tensor([4]))
    counts = tensor([3, 0, 3])
    assert table.read(rows, tensor([0, 0, 0]), counts, 6).tolist() == [5, 6, 4, 7, 8, 9]
    assert table.read_reversed(rows, counts, 6).tolist() == [4, 6, 5, 9, 8, 7]
    table.write(rows[2:], tensor([2000]), tensor([2]), tensor([1, 2]))  # past 1024 columns
    assert table.read(rows[2:], tensor([2000]), tensor([2]), 2).tolist() == [1, 2]
    table.give_back(rows)
    assert sorted(table.lend(20).tolist())[:3] == sorted(rows.tolist())
