# The metrics' facts of a run of steps as a compiled module counts them (FactColumns:
# C++ vectors, no Python object per step), and the RunFacts it hands over
# (kvsched.optimized.facts), with the array.array columns a Python reader takes; one
# copy for both counters (included by state.pyx and compiled.pyx; each cimports array,
# vector, int64_t, memcpy and imports RunFacts).

cdef array.array INTS = array.array("q"), FLOATS = array.array("d")


cdef array.array ints(const vector[int64_t]& v):
    cdef array.array a = array.clone(INTS, v.size(), False)
    if v.size():
        memcpy(a.data.as_voidptr, v.data(), v.size() * sizeof(int64_t))
    return a


cdef array.array floats(const vector[double]& v):
    cdef array.array a = array.clone(FLOATS, v.size(), False)
    if v.size():
        memcpy(a.data.as_voidptr, v.data(), v.size() * sizeof(double))
    return a


cdef class FactColumns:
    """The facts of the steps counted since the last `take`, field by field as RunFacts
    has them (`untimed`: the first step without time_ms, -1 for none)."""

    cdef int64_t untimed, prompt, swap_ins, evicted, recomputes, swaps, recomputed
    cdef vector[int64_t] gen, comp, vic, wait, run, swap, kv
    cdef list a_ids, m_ids, t_ids, ab_ids, rj_ids, d_ids
    cdef vector[int64_t] a_step, m_known, m_hit, t_step, d_step, d_out
    cdef vector[double] a_clock, t_clock, d_clock

    def __cinit__(self):
        self.clear()

    cdef void clear(self):
        self.untimed = -1
        self.prompt = self.swap_ins = self.evicted = 0
        self.recomputes = self.swaps = self.recomputed = 0
        self.gen.clear(); self.comp.clear(); self.vic.clear(); self.wait.clear()
        self.run.clear(); self.swap.clear(); self.kv.clear()
        self.a_ids, self.m_ids, self.t_ids = [], [], []
        self.ab_ids, self.rj_ids, self.d_ids = [], [], []
        self.a_step.clear(); self.m_known.clear(); self.m_hit.clear()
        self.t_step.clear(); self.d_step.clear(); self.d_out.clear()
        self.a_clock.clear(); self.t_clock.clear(); self.d_clock.clear()

    cdef object take(self, double clock):
        """The RunFacts counted (`clock`: the ms at the end of the run), cleared."""
        f = RunFacts(
            ints(self.gen), ints(self.comp), ints(self.vic), ints(self.wait),
            ints(self.run), ints(self.swap), ints(self.kv), self.prompt,
            self.swap_ins, self.evicted, self.recomputes, self.swaps, self.recomputed,
            clock, self.untimed,
            self.a_ids, ints(self.a_step), floats(self.a_clock),
            self.m_ids, ints(self.m_known), ints(self.m_hit),
            self.t_ids, ints(self.t_step), floats(self.t_clock),
            self.ab_ids, self.rj_ids,
            self.d_ids, ints(self.d_step), ints(self.d_out), floats(self.d_clock))
        self.clear()
        return f
