// N-gram index: updates, lookup, draft-tree merge, file image. Layout and rules in ngram_index.h.
#include "kernels/ngram/ngram_index.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace specdec {
namespace ngram {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the n-gram file image is little-endian and written in host order");

// One step of the n-gram / continuation hash (splitmix64 finaliser over the running value and the
// token): order-sensitive, and every token changes all 64 bits.
inline uint64_t mix(uint64_t h, int32_t token) {
  uint64_t z = h + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kHashSeed = 0x5DEECE66Dull;

// An n-gram's hash runs backwards from its last token, so the hashes of every suffix order of a
// context come out of one pass.
inline uint64_t suffix_hash(uint64_t shorter, int32_t first_token) { return mix(shorter, first_token); }

uint64_t span_hash(const int32_t* t, int64_t n) {
  uint64_t h = kHashSeed;
  for (int64_t i = 0; i < n; ++i) h = mix(h, t[i]);
  return h;
}

bool same(const int32_t* a, const int32_t* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(int32_t)) == 0;
}

// File image layout (little-endian):
//   [0, 8)   magic "SDNGRAM\0"         [8, 12)  format version (uint32)
//   [12, 16) n_min (uint32)             [16, 20) n_max (uint32)        [20, 24) zero
//   [24, 32) num_tokens (uint64)        [32, 40) num_documents (uint64)
//   then int32 tokens[num_tokens], uint64 document_starts[num_documents],
//   then uint64 FNV-1a 64 of every byte before it.
constexpr char kMagic[8] = {'S', 'D', 'N', 'G', 'R', 'A', 'M', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 40;

uint64_t fnv1a(const char* data, size_t size) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001B3ull;
  }
  return h;
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void check_orders(int64_t n_min, int64_t n_max, const char* who) {
  if (n_min < 1 || n_max < n_min || n_max > kMaxOrder)
    throw std::invalid_argument(std::string(who) + ": need 1 <= n_min <= n_max <= " +
                                std::to_string(kMaxOrder) + ", got n_min=" +
                                std::to_string(n_min) + ", n_max=" + std::to_string(n_max));
}

}  // namespace

NgramIndex::NgramIndex(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
  check_orders(n_min, n_max, "NgramIndex");
  doc_starts_.push_back(0);
  tables_.resize(static_cast<size_t>(n_max - n_min + 1));
}

size_t NgramIndex::memory_bytes() const {
  size_t bytes = sizeof(*this) + tokens_.capacity() * sizeof(int32_t) +
                 doc_starts_.capacity() * sizeof(int64_t) + tables_.capacity() * sizeof(Table);
  for (const Table& t : tables_)
    bytes += t.slots.capacity() * sizeof(Slot) + t.prev.capacity() * sizeof(int32_t);
  return bytes;
}

void NgramIndex::start_document() {
  if (size() > doc_starts_.back()) doc_starts_.push_back(size());
}

int64_t NgramIndex::document_end(int64_t position) const {
  const auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), position);
  return it == doc_starts_.end() ? size() : *it;
}

void NgramIndex::grow(Table& t) {
  const size_t capacity = t.slots.empty() ? 64 : 2 * t.slots.size();
  std::vector<Slot> old(capacity, Slot{0, -1, 0});
  old.swap(t.slots);
  const size_t mask = capacity - 1;
  for (const Slot& s : old) {
    if (s.last < 0) continue;
    size_t i = s.hash & mask;
    while (t.slots[i].last >= 0) i = (i + 1) & mask;
    t.slots[i] = s;
  }
}

const NgramIndex::Slot* NgramIndex::find(const Table& t, int n, const int32_t* end,
                                         uint64_t hash) const {
  if (t.slots.empty()) return nullptr;
  const size_t mask = t.slots.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = t.slots[i];
    if (s.last < 0) return nullptr;  // at most half full, so an empty slot always ends the probe
    if (s.hash == hash && same(tokens_.data() + s.last - n, end - n, n)) return &s;
  }
}

void NgramIndex::insert(Table& t, int n, int64_t position, uint64_t hash) {
  if (2 * (t.used + 1) > static_cast<int64_t>(t.slots.size())) grow(t);
  const size_t mask = t.slots.size() - 1;
  const int32_t* gram = tokens_.data() + position - n;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    Slot& s = t.slots[i];
    if (s.last < 0) {
      s = Slot{hash, static_cast<int32_t>(position), 1};
      ++t.used;
      return;  // t.prev[position] stays -1: the first occurrence
    }
    if (s.hash == hash && same(tokens_.data() + s.last - n, gram, n)) {
      t.prev[position] = s.last;
      s.last = static_cast<int32_t>(position);
      ++s.count;
      return;
    }
  }
}

// The token at position L = size() completes, for each order n, the n-gram tokens[L - n, L) with
// continuation L (if that n-gram lies inside the current document).
void NgramIndex::append_checked(int32_t token) {
  const int64_t position = size();
  tokens_.push_back(token);
  for (Table& t : tables_) t.prev.push_back(-1);
  const int64_t doc_start = doc_starts_.back();
  uint64_t h = kHashSeed;
  for (int n = 1; n <= n_max_ && position - n >= doc_start; ++n) {
    h = suffix_hash(h, tokens_[position - n]);
    if (n >= n_min_) insert(tables_[n - n_min_], n, position, h);
  }
}

void NgramIndex::extend(const int64_t* tokens, int64_t count) {
  if (count < 0) throw std::invalid_argument("NgramIndex.extend: negative token count");
  for (int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || tokens[i] > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument("NgramIndex.extend: tokens[" + std::to_string(i) + "] = " +
                                  std::to_string(tokens[i]) + " is not a token id in [0, 2^31)");
  if (size() + count > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("NgramIndex.extend: an index holds fewer than 2^31 tokens");
  // No reserve(size + count) here: an exact reserve per call would defeat the vectors' geometric
  // growth and copy every token on every commit.
  for (int64_t i = 0; i < count; ++i) append_checked(static_cast<int32_t>(tokens[i]));
}

int64_t NgramIndex::count(const int32_t* ngram, int n) const {
  if (n < n_min_ || n > n_max_)
    throw std::invalid_argument("NgramIndex.count: the n-gram has " + std::to_string(n) +
                                " tokens, outside this index's orders [" + std::to_string(n_min_) +
                                ", " + std::to_string(n_max_) + "]");
  uint64_t h = kHashSeed;
  for (int j = 1; j <= n; ++j) h = suffix_hash(h, ngram[n - j]);
  const Slot* s = find(tables_[n - n_min_], n, ngram + n, h);
  return s ? s->count : 0;
}

int NgramIndex::collect_candidates(const int32_t* context, int64_t context_len, int k,
                                   int max_occurrences, std::vector<Candidate>& out) const {
  out.clear();
  const int top = static_cast<int>(std::min<int64_t>(n_max_, context_len));
  uint64_t hashes[kMaxOrder + 1];
  hashes[0] = kHashSeed;
  for (int n = 1; n <= top; ++n) hashes[n] = suffix_hash(hashes[n - 1], context[context_len - n]);
  const int32_t* end = context + context_len;
  for (int n = top; n >= n_min_; --n) {
    const Table& t = tables_[n - n_min_];
    const Slot* s = find(t, n, end, hashes[n]);
    if (!s) continue;
    // Newest occurrence first; a group's first occurrence is its newest, so `out` is in recency
    // order before the stable sort by count, then length.
    int seen = 0;
    for (int64_t p = s->last; p >= 0 && seen < max_occurrences; p = t.prev[p], ++seen) {
      const int32_t length = static_cast<int32_t>(std::min<int64_t>(k, document_end(p) - p));
      const uint64_t h = span_hash(tokens_.data() + p, length);
      bool grouped = false;
      for (Candidate& c : out)
        if (c.hash == h && c.length == length &&
            same(tokens_.data() + c.start, tokens_.data() + p, length)) {
          ++c.count;
          grouped = true;
          break;
        }
      if (!grouped) out.push_back(Candidate{p, length, 1, h});
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const Candidate& a, const Candidate& b) {
                       return a.count != b.count ? a.count > b.count : a.length > b.length;
                     });
    return n;
  }
  return 0;
}

int64_t build_draft_tree(const std::vector<Span>& candidates, int64_t budget, DraftRows out,
                         int64_t b) {
  // Node 0 is the root; created nodes 1..m in insertion order, children as linked lists in
  // insertion order (first_child / next_sibling), so the BFS below is deterministic.
  thread_local std::vector<int64_t> token, first_child, last_child, next_sibling, bfs_slot, queue;
  const size_t cap = static_cast<size_t>(budget) + 1;
  token.assign(cap, 0);
  first_child.assign(cap, -1);
  last_child.assign(cap, -1);
  next_sibling.assign(cap, -1);
  int64_t created = 0;
  for (const Span& span : candidates) {
    int64_t cur = 0;
    for (int32_t i = 0; i < span.length; ++i) {
      int64_t c = first_child[cur];
      while (c >= 0 && token[c] != span.tokens[i]) c = next_sibling[c];
      if (c < 0) {
        if (created == budget) break;
        c = ++created;
        token[c] = span.tokens[i];
        if (last_child[cur] < 0)
          first_child[cur] = c;
        else
          next_sibling[last_child[cur]] = c;
        last_child[cur] = c;
      }
      cur = c;
    }
  }
  // BFS: bfs_slot[v] = v's node index in the Draft layout (root 0, draft node j -> j + 1).
  bfs_slot.assign(cap, 0);
  queue.assign(1, 0);
  int64_t* tokens = out.tokens + b * out.width;
  int64_t* parents = out.parents + b * out.width;
  int64_t j = 0;
  for (size_t head = 0; head < queue.size(); ++head) {
    const int64_t v = queue[head];
    for (int64_t c = first_child[v]; c >= 0; c = next_sibling[c]) {
      tokens[j] = token[c];
      parents[j] = bfs_slot[v];
      bfs_slot[c] = ++j;
      queue.push_back(c);
    }
  }
  out.num_nodes[b] = j;
  return j;
}

void lookup_batch(const std::vector<const NgramIndex*>& indexes, const NgramIndex* corpus, int k,
                  int num_candidates, int max_occurrences, const int64_t* max_nodes,
                  const int64_t* max_depth, DraftRows out) {
  if (k < 1 || num_candidates < 1 || max_occurrences < 1)
    throw std::invalid_argument("ngram lookup: need k >= 1, num_candidates >= 1 and "
                                "max_occurrences >= 1, got k=" + std::to_string(k) +
                                ", num_candidates=" + std::to_string(num_candidates) +
                                ", max_occurrences=" + std::to_string(max_occurrences));
  std::vector<Candidate> own, shared;
  std::vector<Span> spans;
  const int64_t batch = static_cast<int64_t>(indexes.size());
  std::fill(out.tokens, out.tokens + batch * out.width, 0);
  std::fill(out.parents, out.parents + batch * out.width, 0);
  for (int64_t b = 0; b < batch; ++b) {
    out.num_nodes[b] = 0;
    const NgramIndex* index = indexes[b];
    const int64_t budget = std::min(max_nodes[b], out.width);
    const int64_t depth = max_depth ? std::min<int64_t>(max_depth[b], k) : k;
    if (!index || budget <= 0 || depth <= 0) continue;
    const int32_t* context = index->tokens();
    const int64_t context_len = index->size();
    index->collect_candidates(context, context_len, k, max_occurrences, own);
    spans.clear();
    for (const Candidate& c : own) {
      if (static_cast<int>(spans.size()) == num_candidates) break;
      spans.push_back(Span{index->tokens() + c.start, c.length});
    }
    const size_t from_own = spans.size();
    if (corpus && static_cast<int>(spans.size()) < num_candidates) {
      corpus->collect_candidates(context, context_len, k, max_occurrences, shared);
      for (const Candidate& c : shared) {
        if (static_cast<int>(spans.size()) == num_candidates) break;
        const int32_t* t = corpus->tokens() + c.start;
        bool duplicate = false;
        for (size_t i = 0; i < from_own && !duplicate; ++i)
          duplicate = spans[i].length == c.length && same(spans[i].tokens, t, c.length);
        if (!duplicate) spans.push_back(Span{t, c.length});
      }
    }
    for (Span& s : spans) s.length = static_cast<int32_t>(std::min<int64_t>(s.length, depth));
    build_draft_tree(spans, budget, out, b);
  }
}

std::string NgramIndex::serialize() const {
  std::string s;
  s.reserve(kHeaderBytes + tokens_.size() * 4 + doc_starts_.size() * 8 + 8);
  s.append(kMagic, sizeof(kMagic));
  put<uint32_t>(s, kFormatVersion);
  put<uint32_t>(s, static_cast<uint32_t>(n_min_));
  put<uint32_t>(s, static_cast<uint32_t>(n_max_));
  put<uint32_t>(s, 0);
  put<uint64_t>(s, tokens_.size());
  put<uint64_t>(s, doc_starts_.size());
  s.append(reinterpret_cast<const char*>(tokens_.data()), tokens_.size() * sizeof(int32_t));
  for (int64_t start : doc_starts_) put<uint64_t>(s, static_cast<uint64_t>(start));
  put<uint64_t>(s, fnv1a(s.data(), s.size()));
  return s;
}

NgramIndex NgramIndex::deserialize(const char* data, size_t size) {
  auto fail = [](const std::string& why) {
    throw std::invalid_argument("n-gram index file: " + why);
  };
  if (size < kHeaderBytes + 8)
    fail("it is " + std::to_string(size) + " bytes, shorter than the " +
         std::to_string(kHeaderBytes + 8) + "-byte header and checksum");
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
    fail("not an n-gram index (the magic bytes are not \"SDNGRAM\")");
  const uint32_t version = get<uint32_t>(data + 8);
  if (version != kFormatVersion)
    fail("format version " + std::to_string(version) + ", this build reads version " +
         std::to_string(kFormatVersion));
  const uint32_t n_min = get<uint32_t>(data + 12), n_max = get<uint32_t>(data + 16);
  const uint64_t num_tokens = get<uint64_t>(data + 24), num_docs = get<uint64_t>(data + 32);
  // Sizes are bounded before any arithmetic on them, so the expected size cannot overflow.
  if (num_tokens > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) ||
      num_docs > num_tokens + 1)
    fail("corrupt header (" + std::to_string(num_tokens) + " tokens, " +
         std::to_string(num_docs) + " documents)");
  const uint64_t expected = kHeaderBytes + 4 * num_tokens + 8 * num_docs + 8;
  if (size != expected)
    fail("the header describes a " + std::to_string(expected) + "-byte file but it has " +
         std::to_string(size) + " bytes (truncated or corrupt)");
  const uint64_t stored = get<uint64_t>(data + size - 8);
  if (stored != fnv1a(data, size - 8)) fail("checksum mismatch (the file is corrupt)");
  check_orders(n_min, n_max, "n-gram index file");

  NgramIndex index(static_cast<int>(n_min), static_cast<int>(n_max));
  const char* tok = data + kHeaderBytes;
  const char* starts = tok + 4 * num_tokens;
  std::vector<uint64_t> doc(num_docs);
  for (uint64_t d = 0; d < num_docs; ++d) doc[d] = get<uint64_t>(starts + 8 * d);
  if (num_docs < 1 || doc[0] != 0) fail("the first document does not start at token 0");
  for (uint64_t d = 1; d < num_docs; ++d)
    if (doc[d] <= doc[d - 1] || doc[d] >= num_tokens)
      fail("document start " + std::to_string(d) + " = " + std::to_string(doc[d]) +
           " is not increasing inside the tokens");
  std::vector<int64_t> chunk;
  for (uint64_t d = 0; d < num_docs; ++d) {
    const uint64_t lo = doc[d], hi = d + 1 < num_docs ? doc[d + 1] : num_tokens;
    chunk.resize(hi - lo);
    for (uint64_t i = lo; i < hi; ++i) {
      chunk[i - lo] = get<int32_t>(tok + 4 * i);
      if (chunk[i - lo] < 0) fail("token " + std::to_string(i) + " is negative (corrupt)");
    }
    index.start_document();
    index.extend(chunk.data(), static_cast<int64_t>(chunk.size()));
  }
  return index;
}

}  // namespace ngram
}  // namespace specdec
