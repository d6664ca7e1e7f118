#include "comm/nodes.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/status.h"

#if defined(KESTREL_HAVE_MPI)
#include "comm/mpi/mpi_group.h"
#endif

namespace kestrel::comm {

std::vector<int> node_ids(const World& world) {
  const int n = world.size();
  std::vector<int> leader(size_t(n), 0);
#if defined(KESTREL_HAVE_MPI)
  if (auto* g = dynamic_cast<MpiGroup*>(world.group().get())) leader = g->shared_memory_leaders();
#endif
  if (const char* env = std::getenv("KESTREL_TEST_NODES"); env && *env) {  // TEST ONLY (see nodes.h)
    std::vector<int> ids;
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0)
        KS_FAIL("KESTREL_TEST_NODES='", env, "': '", item, "' is not a node id (comma-separated integers >= 0)");
      ids.push_back(int(v));
    }
    if (int(ids.size()) != n)
      KS_FAIL("KESTREL_TEST_NODES='", env, "' gives ", ids.size(), " node ids for ", n, " ranks; give one per rank");
    leader = ids;
  }
  // Renumbered in the order of each node's first rank.
  std::vector<int> out(size_t(n), 0), seen;
  for (int r = 0; r < n; ++r) {
    auto it = std::find(seen.begin(), seen.end(), leader[size_t(r)]);
    if (it == seen.end()) {
      seen.push_back(leader[size_t(r)]);
      it = seen.end() - 1;
    }
    out[size_t(r)] = int(it - seen.begin());
  }
  return out;
}

int local_rank(const World& world) {
  for (const char* e : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(e); v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (*end != '\0' || r < 0) KS_FAIL(e, "='", v, "' is not a local rank (an integer >= 0)");
      return int(r);
    }
  if (world.size() == 1) return 0;
  const std::vector<int> node = node_ids(world);
  int r = 0;
  for (int i = 0; i < world.rank(); ++i) r += node[size_t(i)] == node[size_t(world.rank())];
  return r;
}

}  // namespace kestrel::comm
