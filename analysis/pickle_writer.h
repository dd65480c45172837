// Writes Python pickles with the small opcode set that PyTorch's memory_viz.js unpickler reads:
// PROTO 4 (no framing), EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/APPENDS, BININT1/BININT2/BININT,
// LONG1, BINFLOAT, SHORT_BINUNICODE/BINUNICODE, NONE/NEWTRUE/NEWFALSE, MEMOIZE + BINGET/LONG_BINGET.
// Never GLOBAL or REDUCE, so loading the file runs no code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpushim::analysis {

class PickleWriter {
 public:
  PickleWriter();  // writes PROTO 4

  // Scalars: each pushes one object.
  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void unsigned_integer(uint64_t v);
  void real(double v);
  void string(std::string_view s);    // bytes that are not UTF-8 become U+FFFD
  void interned(std::string_view s);  // a string that repeats (keys, names): written once, then referenced

  // Containers: begin_dict(), then key and value objects alternately, then end_dict(). Items are
  // flushed in batches of 1000, as CPython's pickler does, so an unpickler's stack stays small.
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();

  // Remembers the complete object on top of the stack (a scalar, or a container after its end_*)
  // and returns its memo index; get() pushes the same object again (a shared reference).
  uint32_t memoize();
  void get(uint32_t memo_index);

  // Ends the pickle with STOP and returns it.
  std::string finish();

 private:
  void pushed();  // one complete object was pushed at the current level
  void flush_level();
  struct Level {
    bool dict;
    uint32_t items;  // objects pushed since the last MARK
  };
  std::string out_;
  std::vector<Level> levels_;
  uint32_t next_memo_ = 0;
  std::unordered_map<std::string, uint32_t> strings_;
};

}  // namespace gpushim::analysis
