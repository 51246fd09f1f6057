/* Makes TensorFlow's chance repeats of request ids frequent, to test what they do
 * (README, Limits, and docs/faults.md; ps_trainer/cluster/repeats.py). A library to preload into the tasks:
 *
 *   gcc -O2 -shared -fPIC -o /tmp/repeat_seeds.so tools/repeat_seeds.c
 *   REPEAT_SEED_EVERY=1000 LD_PRELOAD=/tmp/repeat_seeds.so ./launch.sh local --sync_replicas
 *
 * Every Nth std::random_device draw of a process (REPEAT_SEED_EVERY, default 1000)
 * returns one fixed value; the others are well mixed. TF seeds each new thread's
 * request-id generator with one draw, and its master runs each step on a new
 * thread, so the steps whose threads got the fixed value send the same request
 * ids: a repeat about every N runs, where by chance it is 1 in 43,000. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uint64_t calls;

static uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

unsigned int _ZNSt13random_device9_M_getvalEv(void *self) {
  static uint64_t every, salt;
  (void)self;
  if (!every) {
    const char *e = getenv("REPEAT_SEED_EVERY");
    every = e ? strtoull(e, 0, 10) : 1000;
    salt = (uint64_t)time(0) ^ (uint64_t)(uintptr_t)&calls;
  }
  uint64_t n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  if (n % every == 0) return 0x5eed5eedu;
  return (unsigned int)mix(n ^ salt);
}
