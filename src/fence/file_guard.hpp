#pragma once
// The file guard: stdin replaces PATH as a whole, only when the token is not older than the greatest
// token PATH has accepted. Side files next to PATH:
//
//   PATH.fence       the side record: the greatest accepted token (decimal, first line), and while a
//                    write is being committed, the previous token and the name of its temp file
//   PATH.fence.lock  the lock file, flock(LOCK_EX) by every writer; never renamed or removed, so all
//                    writers lock the same inode (a lock on a file that gets renamed over would let
//                    two writers in at once)
// Neither is ever followed through a symbolic link (O_NOFOLLOW): a link there is an error.
//
// The data temp file is created unnamed (O_TMPFILE) and linked under a random name only at the
// commit, so a guard killed before then leaves nothing; where the filesystem lacks O_TMPFILE it is
// named from the start and removed when a signal (HUP, INT, QUIT, TERM) stops the guard.
//
// Commit order (see commit() in file_guard.cpp): data temp file written and fsynced; side record
// "T / pending P TEMP" renamed into place and the directory fsynced; then the data temp renamed over
// PATH (the single commit point) and the directory fsynced again. After a crash between the two
// renames, TEMP still exists, which proves that T's data never landed: the effective token is P.
// Once TEMP is gone, T is in force. So a token counts as accepted exactly when its data is in PATH.
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

namespace fencerun::fence {

struct SideRecord {
  std::uint64_t token = 0;  // greatest accepted token, once the pending write (if any) landed
  struct Pending {
    std::uint64_t previous = 0;  // the token in force before that write (0: none)
    std::string temp_name;       // the data temp file of that write, in PATH's directory
  };
  std::optional<Pending> pending;
};

// Parses the side record's text. Accepts a bare decimal token with or without a trailing newline
// (so a record can be seeded by hand); the error says what is malformed.
std::expected<SideRecord, std::string> parse_side_record(std::string_view text);
std::string format_side_record(const SideRecord& record);

// The token in force: `record.token`, unless its pending temp file still exists (`temp_exists`).
std::uint64_t effective_token(const SideRecord& record, bool temp_exists);

// Runs the guard: reads stdin, returns the exit code (0, 77, k_write_failed on I/O errors and
// symlinked side files, or 128+N when signal N stopped it before the commit; with a message on
// stderr).
int run_file_guard(std::uint64_t token, const std::string& path);

// The read of a read-modify-write (`fence file --read`): under the lock, admits `token` as the write
// does (records it when it is greater than the token in force; 77 when it is older) and prints PATH
// (nothing when PATH does not exist yet). A later write with an older token is then rejected, so an
// owner that read before a newer one cannot overwrite what the newer one wrote. Returns 0, 77, 1 (I/O
// error) or 128+N (signal N while waiting for the lock; nothing recorded).
int run_file_read(std::uint64_t token, const std::string& path);

}  // namespace fencerun::fence
