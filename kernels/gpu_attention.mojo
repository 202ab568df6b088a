# MILI's GPU attention module: paged attention over a ragged batch (Modular's `nn` flash attention on MILI's
# separate K/V caches) and MILI's own KV write kernel, compiled for nvidia:sm_90a. On an H200: the KV write is exact,
# decode-only steps and single prefills agree with the reference; short sequences came out NaN until shared memory
# was zeroed before the attention (SHARED_MEMORY_FILL below; README, "On a GPU").
#
# One build per model shape: the head counts and head_dim are compile-time constants, given at build time as
# `-D MILI_NQ=.. -D MILI_NKV=.. -D MILI_HD=..` (kernels/builder/gpu_modules.py); pages are 16 tokens. Only bfloat16.
#
# Streams (see kernels/builder/gpu_modules.py's docstring for the research behind this):
# - `write_kv` is enqueued directly on the caller's CUDA stream (torch's current stream), wrapped with
#   `DeviceContext.create_external_stream`: ordered with torch's work, no synchronisation, capturable.
# - Modular's flash attention takes a `DeviceContext` and enqueues on that context's own stream; the 26.7 API
#   has no way to bind a context to an external stream. So `paged_attention` joins the two streams with events,
#   never with a host wait: an event recorded on torch's stream is waited for by the context's stream, the
#   attention is enqueued there, and an event recorded after it is waited for by torch's stream (the fork/join
#   pattern CUDA graph capture accepts across streams).
# - The DeviceContext is created once per process (`create_context`) and kept on the heap; its address travels
#   through Python, because a new context per call would load the kernels' code again each time.
#
# Conventions at the boundary (kernels/gpu_attention.py converts and checks):
# - q, out: [total_q, NQ, HD] bf16 contiguous; k_cache, v_cache: [num_blocks, 16, NKV, HD] bf16 contiguous.
# - block_table: [batch, max_pages] uint32; row_offsets: [batch + 1] uint32 (query rows of each sequence).
# - cache_lengths: [batch] uint32, Modular's convention: tokens cached BEFORE this step (MILI's context length
#   less the step's query length); the step's own K/V must already be in the cache (write_kv first).

from std.python import Python, PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.memory.alloc import unsafe_alloc
from std.sys.defines import get_defined_int
from std.utils.index import Index, IndexList
from max.gpu import thread_idx, block_idx, block_dim
from max.gpu.host import DeviceContext, DeviceStream, FuncAttribute
from max.gpu.memory import external_memory
from layout import Layout, LayoutTensor, RuntimeLayout, lt_to_tt, UNKNOWN_VALUE
from kv_cache.types import PagedKVCacheCollection, KVCacheStaticParams
from nn.attention.gpu.mha import MHADecodeDispatchMetadata, flash_attention
from nn.attention.mha_mask import CausalMask

comptime BF16 = DType.bfloat16
comptime NQ = get_defined_int["MILI_NQ", 16]()
comptime NKV = get_defined_int["MILI_NKV", 8]()
comptime HD = get_defined_int["MILI_HD", 128]()
comptime PAGE = 16
comptime GROUP = NQ // NKV
comptime ROW = NKV * HD  # elements of one token's K (or V) in the cache
comptime VEC = 8  # bf16 elements per thread in write_kv: 16 bytes
comptime WRITE_THREADS = 256
# SHARED_MEMORY_FILL: Modular's attention kernels (max-core 26.7, sm_90a) compute a key tile's scores and P x V over
# shared memory they do not load for the keys past a sequence's end: those keys get zero weight, but whatever an
# earlier kernel left there stays in the product, and a NaN or infinity left there makes the row NaN (0 x NaN). Seen
# on an H200 (loadtest/gpu/mixed_probe.py): in a process whose earlier kernels had run, most random steps mixing
# sequences turned their short sequences' rows (fewer keys than a tile) into NaN, decode-only steps too; with every
# SM's shared memory zeroed just before the attention, none did, and with it filled with NaN they failed as before.
# So paged_attention first runs fill_shared_kernel with zeros on the attention's stream: as much shared memory as one
# block may take on Hopper (227 KiB), four blocks per SM of an H100/H200 (132 SMs), so every SM runs at least one.
comptime FILL_BYTES = 227 * 1024
comptime FILL_THREADS = 1024
comptime FILL_BLOCKS = 4 * 132

comptime KVP = KVCacheStaticParams(num_heads=NKV, head_size=HD)
comptime Coll = PagedKVCacheCollection[BF16, KVP, PAGE, MutAnyOrigin, ImmutAnyOrigin, ImmutAnyOrigin, MutAnyOrigin]
comptime CACHE = Layout.row_major(UNKNOWN_VALUE, PAGE, NKV, HD)
comptime ROWS = Layout.row_major(UNKNOWN_VALUE, NQ, HD)
comptime TABLE = Layout.row_major[2]()
comptime VECTOR = Layout(UNKNOWN_VALUE)


@export
def PyInit_mili_gpu_attention() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_gpu_attention")
        m.def_function[shape]("shape",
                              docstring="(query heads, KV heads, head_dim, page size) this module was built for")
        m.def_function[create_context]("create_context", docstring="a DeviceContext for one GPU, as an address")
        m.def_function[write_kv]("write_kv", docstring="key/value rows into the paged caches at their slots")
        m.def_function[paged_attention]("paged_attention", docstring="causal paged attention over a ragged batch")
        m.def_function[fill_shared]("fill_shared", docstring="every SM's shared memory filled with a 32-bit pattern")
        m.def_function[read_shared]("read_shared", docstring="one block's shared memory as it finds it")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))


def shape() raises -> PythonObject:
    return Python.tuple(NQ, NKV, HD, PAGE)


def create_context(device_id: PythonObject) raises -> PythonObject:
    """Never freed: one per process, alive as long as the module."""
    comptime assert NQ % NKV == 0, "query heads must group over KV heads"
    comptime assert ROW % VEC == 0, "a token's K/V row must split into 16-byte vectors"
    var p = unsafe_alloc[DeviceContext](1)
    p.unsafe_write(DeviceContext(Int(py=device_id)))
    return PythonObject(Int(p))


def _context(addr: PythonObject) raises -> Pointer[DeviceContext, MutAnyOrigin]:
    return Pointer[DeviceContext, MutAnyOrigin](unsafe_from_address=Int(py=addr))


def _bf16(addr: PythonObject) raises -> Pointer[Scalar[BF16], MutAnyOrigin]:
    return Pointer[Scalar[BF16], MutAnyOrigin](unsafe_from_address=Int(py=addr))


def _stream_handle(addr: PythonObject) raises -> Pointer[NoneType, MutAnyOrigin]:
    return Pointer[NoneType, MutAnyOrigin](unsafe_from_address=Int(py=addr))


def write_kv_kernel(k_cache: Pointer[Scalar[BF16], MutAnyOrigin], v_cache: Pointer[Scalar[BF16], MutAnyOrigin],
                    key: Pointer[Scalar[BF16], MutAnyOrigin], value: Pointer[Scalar[BF16], MutAnyOrigin],
                    slots: Pointer[Int64, MutAnyOrigin], num_tokens: Int64, num_slots: Int64,
                    key_stride: Int64, value_stride: Int64):
    """One thread per 16-byte vector of one token's K and V row. A slot outside the cache is skipped (the
    host cannot check device-resident slots without a sync; skipping keeps a bad slot from writing elsewhere)."""
    var i = Int64(block_idx.x) * Int64(block_dim.x) + Int64(thread_idx.x)
    comptime PER_TOKEN = Int64(ROW // VEC)
    var token = i // PER_TOKEN
    if token >= num_tokens:
        return
    var col = Int((i % PER_TOKEN) * Int64(VEC))
    var slot = slots[unsafe_offset=Int(token)]
    if slot < 0 or slot >= num_slots:
        return
    var k = key.unsafe_offset(Int(token * key_stride) + col).unsafe_load[width=VEC]()
    var v = value.unsafe_offset(Int(token * value_stride) + col).unsafe_load[width=VEC]()
    k_cache.unsafe_offset(Int(slot) * ROW + col).unsafe_store(k)
    v_cache.unsafe_offset(Int(slot) * ROW + col).unsafe_store(v)


def write_kv(args: PythonObject) raises -> PythonObject:
    # args: (context, stream, k_cache, v_cache, key, value, slots, num_tokens, num_slots, key_stride, value_stride)
    var ctx = _context(args[0])
    var num_tokens = Int(py=args[7])
    if num_tokens == 0:
        return PythonObject(None)
    var stream = ctx[].create_external_stream(_stream_handle(args[1]))
    var kernel = ctx[].compile_function[write_kv_kernel]()
    var threads = num_tokens * (ROW // VEC)
    stream.enqueue_function(
        kernel, _bf16(args[2]), _bf16(args[3]), _bf16(args[4]), _bf16(args[5]),
        Pointer[Int64, MutAnyOrigin](unsafe_from_address=Int(py=args[6])), Int64(num_tokens),
        Int64(Int(py=args[8])), Int64(Int(py=args[9])), Int64(Int(py=args[10])),
        grid_dim=(threads + WRITE_THREADS - 1) // WRITE_THREADS, block_dim=WRITE_THREADS)
    return PythonObject(None)


def fill_shared_kernel(bits: UInt32):
    """Writes `bits` over the block's whole dynamic shared memory (why: SHARED_MEMORY_FILL above)."""
    var smem = external_memory[UInt32, address_space=AddressSpace.SHARED, alignment=16, name="mili_fill"]()
    var i = Int(thread_idx.x) * 4
    while i < FILL_BYTES // 4:
        smem.store[alignment=16](i, SIMD[DType.uint32, 4](bits))  # 16-byte stores (a global: not dropped)
        i += FILL_THREADS * 4


def read_shared_kernel(dest: Pointer[UInt32, MutAnyOrigin], words: Int32):
    """Copies the first `words` 32-bit words of the block's dynamic shared memory, as it finds them, to `dest`: what
    fill_shared left there (the GPU tests check that the fill the self-check relies on takes effect)."""
    var smem = external_memory[UInt32, address_space=AddressSpace.SHARED, alignment=16, name="mili_read"]()
    var i = Int(thread_idx.x)
    while i < Int(words):
        dest.unsafe_offset(i).unsafe_store(smem.load(i))
        i += FILL_THREADS


def _enqueue_fill(ctx: Pointer[DeviceContext, MutAnyOrigin], stream: DeviceStream, bits: UInt32) raises:
    var kernel = ctx[].compile_function[fill_shared_kernel](
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(FILL_BYTES)))
    stream.enqueue_function(kernel, bits, grid_dim=FILL_BLOCKS, block_dim=FILL_THREADS, shared_mem_bytes=FILL_BYTES)


def fill_shared(args: PythonObject) raises -> PythonObject:
    # args: (context, stream, bits): every SM's shared memory filled with the 32-bit pattern `bits`, on the caller's
    # stream (the self-check and the tests put NaN there before an attention, as earlier kernels may leave it).
    var ctx = _context(args[0])
    _enqueue_fill(ctx, ctx[].create_external_stream(_stream_handle(args[1])), UInt32(Int(py=args[2])))
    return PythonObject(None)


def read_shared(args: PythonObject) raises -> PythonObject:
    # args: (context, stream, out, words): one block's view of its shared memory, `words` uint32 into `out`.
    var ctx = _context(args[0])
    var words = Int(py=args[3])
    if words < 0 or words > FILL_BYTES // 4:
        raise Error("read_shared: words must be within the filled shared memory")
    var kernel = ctx[].compile_function[read_shared_kernel](
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(FILL_BYTES)))
    ctx[].create_external_stream(_stream_handle(args[1])).enqueue_function(
        kernel, Pointer[UInt32, MutAnyOrigin](unsafe_from_address=Int(py=args[2])), Int32(words), grid_dim=1,
        block_dim=FILL_THREADS, shared_mem_bytes=FILL_BYTES)
    return PythonObject(None)


def paged_attention(args: PythonObject) raises -> PythonObject:
    # args: (context, stream, q, out, k_cache, v_cache, num_blocks, block_table, max_pages, cache_lengths,
    #        row_offsets, batch, total_q, max_q_len, max_cache_len, scale, zero_shared)
    var ctx = _context(args[0])
    var num_blocks = Int(py=args[6])
    var max_pages = Int(py=args[8])
    var batch = Int(py=args[11])
    var total_q = Int(py=args[12])
    var max_q_len = Int(py=args[13])
    var max_cache_len = Int(py=args[14])  # the longest context, this step's tokens included
    var scale = Float32(Float64(py=args[15]))
    if batch == 0:
        return PythonObject(None)

    var k_pages = LayoutTensor[BF16, CACHE, MutAnyOrigin](
        _bf16(args[4]), RuntimeLayout[CACHE].row_major(IndexList[4](num_blocks, PAGE, NKV, HD)))
    var v_pages = LayoutTensor[BF16, CACHE, MutAnyOrigin](
        _bf16(args[5]), RuntimeLayout[CACHE].row_major(IndexList[4](num_blocks, PAGE, NKV, HD)))
    var table = LayoutTensor[DType.uint32, TABLE, ImmutAnyOrigin](
        Pointer[Scalar[DType.uint32], ImmutAnyOrigin](unsafe_from_address=Int(py=args[7])),
        RuntimeLayout[TABLE].row_major(Index(batch, max_pages)))
    var cache_lengths = LayoutTensor[DType.uint32, VECTOR, ImmutAnyOrigin](
        Pointer[Scalar[DType.uint32], ImmutAnyOrigin](unsafe_from_address=Int(py=args[9])),
        RuntimeLayout[VECTOR].row_major(IndexList[1](batch)))
    var row_offsets = LayoutTensor[DType.uint32, VECTOR, ImmutAnyOrigin](
        Pointer[Scalar[DType.uint32], ImmutAnyOrigin](unsafe_from_address=Int(py=args[10])),
        RuntimeLayout[VECTOR].row_major(IndexList[1](batch + 1)))
    var q = LayoutTensor[BF16, ROWS, MutAnyOrigin](
        _bf16(args[2]), RuntimeLayout[ROWS].row_major(IndexList[3](total_q, NQ, HD)))
    var out = LayoutTensor[BF16, ROWS, MutAnyOrigin](
        _bf16(args[3]), RuntimeLayout[ROWS].row_major(IndexList[3](total_q, NQ, HD)))
    var k = Coll.CacheType(lt_to_tt(k_pages), lt_to_tt(cache_lengths), lt_to_tt(table), UInt32(max_q_len),
                           UInt32(max_cache_len))
    var v = Coll.CacheType(lt_to_tt(v_pages), lt_to_tt(cache_lengths), lt_to_tt(table), UInt32(max_q_len),
                           UInt32(max_cache_len))
    var zero_shared = Bool(py=args[16])
    # Host-side scalars only (the SM count comes from the context's cached device properties).
    var md = MHADecodeDispatchMetadata.from_runtime_values[NQ, GROUP](batch, max_q_len, max_cache_len, ctx[])

    # Fork from torch's stream onto the context's stream and join back: device-side event waits only.
    var torch_stream = ctx[].create_external_stream(_stream_handle(args[1]))
    var inputs_ready = ctx[].create_event()
    torch_stream.record_event(inputs_ready)
    ctx[].stream().enqueue_wait_for(inputs_ready)
    if zero_shared:
        _enqueue_fill(ctx, ctx[].stream(), UInt32(0))
    flash_attention[ragged=True](lt_to_tt(out), lt_to_tt(q), k, v, CausalMask(), lt_to_tt(row_offsets), scale,
                                 ctx[], decode_dispatch_metadata=md)
    var attended = ctx[].create_event()
    ctx[].stream().record_event(attended)
    torch_stream.enqueue_wait_for(attended)
    return PythonObject(None)
