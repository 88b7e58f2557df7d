// cub/device/device_radix_sort.cuh, as the host stand-in sees it (../../cuda_host.h says what this
// directory is): SortPairs, the one call cuda/cuda_norm.cu makes — a stable sort of (key, value)
// pairs by the key's bits [begin_bit, end_bit), as CUB's radix sort is.
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

#include "../../cuda_runtime.h"

namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                                 V* values_out, int n, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8,
                                 cudaStream_t = nullptr) {
        if (!temp) {  // the size query
            temp_bytes = 16;
            return cudaSuccess;
        }
        const int w = end_bit - begin_bit;
        const K mask = w >= (int)sizeof(K) * 8 ? (K)~(K)0 : (K)(((K)1 << w) - 1);
        auto bits = [&](int i) { return (K)((keys_in[i] >> begin_bit) & mask); };
        std::vector<int> order(n > 0 ? n : 0);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bits(a) < bits(b); });
        for (int i = 0; i < n; i++) keys_out[i] = keys_in[order[i]], values_out[i] = values_in[order[i]];
        return cudaSuccess;
    }
};
}  // namespace cub
