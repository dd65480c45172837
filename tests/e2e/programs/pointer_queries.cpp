// Pointer queries on two small neighbouring allocations (which a pool carves from one segment)
// and on one after it was freed. Under any policy the answers must describe the allocation the
// caller was given, as plain CUDA does; printed relative to the pointers for the test to compare.
#include <cuda.h>

#include "support/driver_api.h"
#include "support/test_support.h"

namespace {

bool first = true;
void field(const char* key, long long v) {
  std::printf("%s\"%s\":%lld", first ? "" : ",", key, v);
  first = false;
}

}  // namespace

int main() {
  const testsupport::Driver& D = testsupport::driver();
  constexpr size_t kSize = 4096;
  char* a = nullptr;
  char* b = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&a), kSize));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&b), kSize));
  const CUdeviceptr da = reinterpret_cast<CUdeviceptr>(a), db = reinterpret_cast<CUdeviceptr>(b);
  std::printf("{");

  CUdeviceptr base = 0;
  size_t size = 0;
  field("range_result", D.MemGetAddressRange(&base, &size, db + 100));
  field("range_base_offset", static_cast<long long>(base) - static_cast<long long>(db));
  field("range_size", static_cast<long long>(size));

  CUdeviceptr start = 0;
  size_t range = 0;
  field("attr_start_result", D.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, db + 100));
  field("attr_start_offset", static_cast<long long>(start) - static_cast<long long>(db));
  D.PointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, db + 100);
  field("attr_range_size", static_cast<long long>(range));

  unsigned long long id_a = 0, id_b = 0;
  unsigned int ipc_a = 0, ipc_b = 0, type_b = 0;
  int ordinal_b = -1;
  CUdeviceptr start_b = 0;
  size_t size_b = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data_b[] = {&id_b, &ipc_b, &type_b, &ordinal_b, &start_b, &size_b};
  field("attrs_result", D.PointerGetAttributes(6, attrs, data_b, db + 8));
  void* data_a[] = {&id_a, &ipc_a, &type_b, &ordinal_b, &start_b, &size_b};
  CUdeviceptr unused_start = 0;
  size_t unused_size = 0;
  data_a[4] = &unused_start;
  data_a[5] = &unused_size;
  D.PointerGetAttributes(6, attrs, data_a, da);
  field("buffer_ids_differ", id_a != id_b);
  field("ipc_capable_a", ipc_a);
  field("ipc_capable_b", ipc_b);
  field("memory_type_b", type_b);
  field("device_b", ordinal_b);
  field("attrs_start_offset_b", static_cast<long long>(start_b) - static_cast<long long>(db));
  field("attrs_size_b", static_cast<long long>(size_b));

  cudaPointerAttributes rt = {};
  CHECK(cudaPointerGetAttributes(&rt, b + 16));
  field("runtime_type", rt.type);
  field("runtime_device", rt.device);
  field("runtime_device_pointer_offset", static_cast<char*>(rt.devicePointer) - (b + 16));

  // cudaMalloc's memory has no allocation handle to retain (CUDA: invalid value); a pool's chunk
  // handle would hand a peer that maps it the bytes of whichever block starts the chunk.
  CUmemGenericAllocationHandle retained = 0;
  field("retain_a_result", D.MemRetainAllocationHandle(&retained, a));
  field("retain_b_result", D.MemRetainAllocationHandle(&retained, b));

  // Freed: no allocation holds these bytes any more, whatever CUDA's segment around them.
  CHECK(cudaFree(b));
  field("freed_range_result", D.MemGetAddressRange(&base, &size, db));
  CUdeviceptr untouched = 0x5eed;  // CUDA refuses the query and leaves the output alone
  field("freed_attr_result", D.PointerGetAttribute(&untouched, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, db));
  field("freed_attr_output_untouched", untouched == 0x5eed);
  unsigned int freed_type = 99;
  CUpointer_attribute type_attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  void* freed_data[] = {&freed_type};
  field("freed_attrs_result", D.PointerGetAttributes(1, &type_attr, freed_data, db));
  field("freed_memory_type", freed_type);
  std::printf("}\n");
  CHECK(cudaFree(a));
  return 0;
}
