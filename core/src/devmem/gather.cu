/* gather.cu: the CUDA provider's copy kernel (devmem.c), one launch for up to 128
 * ranges inside one device's memory, where a copy-engine call each costs the driver
 * about 3.5 us (docs/device-memory.md). blockIdx.y is the range; the blocks along x
 * share it. 16 bytes a load where both ends are 16-byte aligned, a byte otherwise.
 * hixl builds without nvcc: gen_gather_ptx.sh makes gather_ptx.h of this file. */
#define HIXL_GATHER_MAX 128
struct hixl_gather {
  unsigned long long dst[HIXL_GATHER_MAX], src[HIXL_GATHER_MAX], len[HIXL_GATHER_MAX];
};

extern "C" __global__ void hixl_gather_copy(const struct hixl_gather g) {
  unsigned i = blockIdx.y;
  char *d = (char *)g.dst[i];
  const char *s = (const char *)g.src[i];
  unsigned long long n = g.len[i];
  unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long k = t;
  if (((g.dst[i] | g.src[i]) & 15ull) == 0) {
    unsigned long long nv = n >> 4;
    uint4 *dv = (uint4 *)d;
    const uint4 *sv = (const uint4 *)s;
    for (; k < nv; k += step) dv[k] = sv[k];
    k = (nv << 4) + t;
  }
  for (; k < n; k += step) d[k] = s[k];
}
