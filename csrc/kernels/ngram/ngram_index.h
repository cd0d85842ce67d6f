// N-gram index over committed tokens, for prompt-lookup / n-gram drafting. Torch-free, host only.
//
// What it stores
// --------------
// The tokens themselves (int32) split into documents (a request's index is one document; a static
// corpus index holds many) and, for every order n in [n_min, n_max], every n-gram that has a
// following token inside its document, mapped to the positions of those following tokens
// ("continuation positions" p: tokens[p - n, p) is the n-gram, tokens[p] the token after it).
//
//   tokens   : a b c a b d          order 2: (a b) -> {2, 5}, (b c) -> {3}, (c a) -> {4}
//   position : 0 1 2 3 4 5                   (a b d) is not there yet: d has no successor
//
// Per order, one open-addressing hash table (slot = n-gram hash, its latest continuation position,
// its count) and one chain array prev[p] = the previous continuation position of the same n-gram
// (-1 at its first). Appending a token at position L inserts, for each order n, the n-gram
// tokens[L - n, L) with continuation L: O(n_max) work per new token (amortised over table growth),
// never a rescan. The n-gram of a slot is read back from the tokens at its latest position, which
// resolves hash collisions exactly.
//
// Lookup (see `collect_candidates` and `build_draft_tree`)
// ---------------------------------------------------------
// For a context (the request's committed tokens), the longest n in [n_max .. n_min] whose suffix
// n-gram has an occurrence; then its newest `max_occurrences` occurrences, newest first, each
// giving the continuation tokens[p, min(p + k, end of p's document)); identical continuations are
// grouped; groups are ranked by how many of those occurrences they have (count), then by length
// (longer first: a recent occurrence near the end of the text has a cut continuation, which would
// draft fewer tokens for the same verification), then by their newest occurrence (recency). The request's candidates come first; a shared static corpus index
// fills the slots they leave. The candidates are merged into one prefix tree (shared prefixes once)
// in rank order under a node budget, and the tree is written in BFS order.
//
// Errors a caller can cause (bad orders, a negative or > INT32_MAX token id, a corrupt file image)
// throw std::invalid_argument with a message naming the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace specdec {
namespace ngram {

// Orders above this are not useful for drafting and would make per-token updates expensive.
constexpr int kMaxOrder = 32;

// One ranked continuation: tokens()[start, start + length) of the index that produced it.
struct Candidate {
  int64_t start;     // continuation position of its newest occurrence
  int32_t length;    // 1 .. k (shorter only when the document ends first)
  int32_t count;     // occurrences among the newest max_occurrences of the matched n-gram
  uint64_t hash;     // hash of the continuation tokens (grouping)
};

class NgramIndex {
 public:
  NgramIndex(int n_min, int n_max);

  // Appends tokens[0, count) to the current document. All ids are checked before anything changes.
  void extend(const int64_t* tokens, int64_t count);
  // Later tokens start a new document: no n-gram and no continuation crosses the boundary.
  void start_document();

  int n_min() const { return n_min_; }
  int n_max() const { return n_max_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_starts_.size()); }
  const int32_t* tokens() const { return tokens_.data(); }
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }
  // Bytes held by this index (tokens, documents, hash tables, chains), capacity included.
  size_t memory_bytes() const;

  // Times `ngram` (length in [n_min, n_max]) occurred with a following token in one document.
  int64_t count(const int32_t* ngram, int n) const;

  // Ranked candidates for the suffix of context[0, context_len), at the longest order that has an
  // occurrence here (returned; 0 when none, with `out` empty). `out` is overwritten.
  int collect_candidates(const int32_t* context, int64_t context_len, int k, int max_occurrences,
                         std::vector<Candidate>& out) const;

  // File image: header (magic, format version, orders, sizes), tokens, document starts, checksum.
  std::string serialize() const;
  static NgramIndex deserialize(const char* data, size_t size);

 private:
  struct Slot {
    uint64_t hash;   // n-gram hash
    int32_t last;    // its newest continuation position; -1 = empty slot
    int32_t count;   // its number of occurrences
  };
  struct Table {
    std::vector<Slot> slots;    // power-of-two capacity, at most half full
    std::vector<int32_t> prev;  // [size()]: previous continuation position of the same n-gram
    int64_t used = 0;
  };

  // The slot of the n-gram context[-n .. -1] (ending just before `end`), or nullptr.
  const Slot* find(const Table& t, int n, const int32_t* end, uint64_t hash) const;
  void insert(Table& t, int n, int64_t position, uint64_t hash);
  static void grow(Table& t);
  void append_checked(int32_t token);
  int64_t document_end(int64_t position) const;

  int n_min_, n_max_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> doc_starts_;  // ascending; doc_starts_[0] == 0
  std::vector<Table> tables_;        // [n_max - n_min + 1], order n at n - n_min
};

// Per-row output of the batched lookup, in the Draft layout: row b's draft node j (root excluded)
// at [b * width + j]; parents as node indices (0 = the root, i + 1 = draft node i), BFS order.
struct DraftRows {
  int64_t* tokens;     // [B, width], tail padded with 0
  int64_t* parents;    // [B, width], tail padded with 0 (the root), so a padded row is a tree
  int64_t* num_nodes;  // [B]
  int64_t width;       // num_candidates * k
};

// Merges ranked candidates (each a token span) into one prefix tree of at most `budget` nodes,
// inserting candidates in rank order (each as deep as the budget allows), and writes row `b` of
// `out` in BFS order, children in insertion order. Returns the number of nodes.
struct Span {
  const int32_t* tokens;
  int32_t length;
};
int64_t build_draft_tree(const std::vector<Span>& candidates, int64_t budget, DraftRows out,
                         int64_t b);

// The whole batched lookup: row b uses indexes[b] (nullptr = no draft) and, for the candidate slots
// its own index leaves empty, `corpus` (nullptr = none), with the suffix of indexes[b]'s tokens.
// max_nodes: [B] node budget per row (clamped to width; <= 0 = no draft). max_depth: [B] most tokens
// of each candidate that enter row b's tree (clamped to k; <= 0 = no draft), or nullptr (= k); the
// ranking is over the k-token continuations either way.
void lookup_batch(const std::vector<const NgramIndex*>& indexes, const NgramIndex* corpus, int k,
                  int num_candidates, int max_occurrences, const int64_t* max_nodes,
                  const int64_t* max_depth, DraftRows out);

}  // namespace ngram
}  // namespace specdec
