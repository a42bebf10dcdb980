# Columns of numbers, from the C++ vectors a compiled module counts them in to the
# array.array a Python reader takes (kvsched.optimized.facts.RunFacts), one copy each
# (included by state.pyx and compiled.pyx; each cimports array, vector, int64_t, memcpy).

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
