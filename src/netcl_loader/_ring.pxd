# Declarations of the C core (csrc/) and of the ring's compiled classes.
from libc.stdint cimport int64_t, uint32_t, uint64_t, intptr_t


cdef extern from "netcl_shm.h" nogil:
    ctypedef struct netcl_shm_t:
        void *addr
        size_t size
        intptr_t handle
    int netcl_shm_create(netcl_shm_t *shm, size_t size, char *err, size_t errlen)
    int netcl_shm_attach(netcl_shm_t *shm, intptr_t handle, size_t size, char *err, size_t errlen)
    void netcl_shm_unmap(netcl_shm_t *shm)
    void netcl_shm_close_handle(intptr_t handle)
    size_t netcl_page_size()
    int netcl_wait_u32(volatile uint32_t *addr, uint32_t expected, int timeout_ms)
    void netcl_wake_all(volatile uint32_t *addr)


cdef extern from "netcl_atomic.h" nogil:
    uint32_t netcl_load_acquire(volatile uint32_t *p)
    void netcl_store_release(volatile uint32_t *p, uint32_t v)
    uint32_t netcl_load_seq(volatile uint32_t *p)
    void netcl_store_seq(volatile uint32_t *p, uint32_t v)
    uint32_t netcl_fetch_add(volatile uint32_t *p, uint32_t v)
    int netcl_cas(volatile uint32_t *p, uint32_t expected, uint32_t desired)


cdef extern from "netcl_ring.h" nogil:
    uint32_t NETCL_RING_MAGIC
    uint32_t NETCL_RING_VERSION
    int NETCL_LINE
    enum:
        NETCL_FREE
        NETCL_ASSIGNED
        NETCL_READY
        NETCL_PIPED
        NETCL_CANCELLED
        NETCL_GROW
    ctypedef struct netcl_ring_header_t:
        uint32_t magic
        uint32_t version
        uint32_t nslots
        uint32_t gen
        uint32_t waiters
        uint32_t token
        uint32_t ticket
        uint32_t nqueues
        uint32_t qcap
        uint32_t index_bytes
    ctypedef struct netcl_slot_header_t:
        uint32_t state
        uint32_t token
        uint32_t owner
        uint32_t epoch
        uint64_t seq
        uint64_t meta_off
        uint64_t meta_len
        uint64_t used
        uint64_t needed
        uint64_t capacity
        uint64_t fetch_ns
        uint64_t collate_ns
        uint64_t transform_ns
        uint64_t write_ns
        uint64_t start_ns
        uint64_t skipped
    netcl_slot_header_t *netcl_slot(void *base, uint32_t i)
    ctypedef struct netcl_queue_t:
        uint32_t head
        uint32_t tail
        uint32_t sleeping
    uint64_t netcl_queues_offset(uint32_t nslots)
    uint64_t netcl_entries_offset(uint32_t nslots, uint32_t nqueues)
    uint64_t netcl_index_offset(uint32_t nslots, uint32_t nqueues, uint32_t qcap)
    uint64_t netcl_header_bytes(uint32_t nslots, uint32_t nqueues, uint32_t qcap, uint32_t index_bytes)
    void netcl_ring_publish(netcl_ring_header_t *hdr, netcl_slot_header_t *s, uint32_t state)
    int netcl_ring_wait_gen(netcl_ring_header_t *hdr, uint32_t seen, int timeout_ms)
    int netcl_queue_push(netcl_queue_t *q, uint32_t *entries, uint32_t qcap, uint32_t entry,
                         int wake)
    uint32_t netcl_queue_kick(netcl_queue_t *q)
    int64_t netcl_queue_pop(netcl_queue_t *q, const uint32_t *entries, uint32_t qcap, int timeout_ms)
    int netcl_ring_assign(netcl_slot_header_t *s, char *area, uint32_t index_bytes, uint32_t token,
                          uint64_t seq, uint32_t owner, uint32_t epoch, const int64_t *indices,
                          uint64_t n)
    int64_t netcl_ring_find_published(netcl_ring_header_t *hdr, const uint32_t *slots, uint32_t n)
    int64_t netcl_ring_wait_next(netcl_ring_header_t *hdr, const uint32_t *slots, uint32_t n,
                                 int any, int timeout_ms)
    int64_t netcl_ring_wait_published(netcl_ring_header_t *hdr, const uint32_t *slots, uint32_t n,
                                      int timeout_ms)


cdef class Segment:
    cdef netcl_shm_t shm
    cdef bint owns_handle
    cdef Py_ssize_t exports
    cdef readonly size_t nbytes


cdef class RingHeader:
    cdef readonly Segment segment
    cdef netcl_ring_header_t *hdr
    cdef readonly uint32_t nslots
    cdef readonly uint32_t nqueues
    cdef readonly uint32_t qcap
    cdef readonly uint32_t index_bytes
    cdef netcl_queue_t *queues
    cdef uint32_t *entries
    cdef char *index_area
    cdef netcl_slot_header_t *slot(self, uint32_t i) except NULL
    cdef netcl_queue_t *queue(self, uint32_t q) except NULL
    cpdef bint push(self, uint32_t q, uint32_t entry, bint wake=*)
    cpdef uint32_t kick(self, uint32_t q)
    cpdef long pop(self, uint32_t q, int timeout_ms)
    cpdef uint32_t state(self, uint32_t i)
    cpdef void publish(self, uint32_t i, uint32_t new_state)
    cpdef uint32_t gen(self)
    cpdef int wait_gen(self, uint32_t seen, int timeout_ms)
    cpdef uint32_t token(self)
    cpdef void set_token(self, uint32_t token)
    cpdef tuple result(self, uint32_t i)
    cpdef tuple task(self, uint32_t i)
    cpdef uint64_t capacity(self, uint32_t i)
    cpdef uint32_t next_ticket(self)
    cpdef tuple times(self, uint32_t i)
