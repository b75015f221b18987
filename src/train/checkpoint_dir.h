// The folder layout of engine checkpoints: save_dir/<tag>/ with the engine's files, and
// save_dir/latest naming the last tag. A tag folder is written under a temporary name next to it and
// then put in place by one rename (or, over an existing tag, one atomic exchange), so a reader sees
// either the previous checkpoint or the complete new one.
#ifndef DST_TRAIN_CHECKPOINT_DIR_H
#define DST_TRAIN_CHECKPOINT_DIR_H

#include <string>
#include <vector>

#include "dstransformer/dstransformer.h"  // defines: dst_status

namespace dst::ckdir {

// A tag is one path component: 1..255 bytes of UTF-8 without '/', control characters, or a leading '.'.
dst_status check_tag(const char *fn, const char *arg, const std::string &tag);
// Creates `path` and its missing parents (mkdir -p); DST_ERR_IO naming the part that failed.
dst_status make_dirs(const char *fn, const std::string &path);
// Creates an empty folder "<parent>/.<tag>.dst-tmp.XXXXXX" for a save in progress.
dst_status make_temp_dir(const char *fn, const std::string &parent, const std::string &tag, std::string *out);
// Removes a temporary folder and the files in it (best effort; for a failed save).
void remove_dir(const std::string &path);
// Puts the complete folder `tmp` in place as `final`. An existing `final` is exchanged with it
// atomically (renameat2 RENAME_EXCHANGE; where the file system lacks it, moved aside first); then the
// files of `ours` are removed from the old folder, anything else in it is moved into the new one, and
// the old folder is removed.
dst_status publish(const char *fn, const std::string &tmp, const std::string &final,
                   const std::vector<std::string> &ours);
// Reads the tag in `dir`/latest (surrounding white space ignored).
dst_status read_latest(const char *fn, const std::string &dir, std::string *tag);
bool is_dir(const std::string &path);

}  // namespace dst::ckdir

#endif  // DST_TRAIN_CHECKPOINT_DIR_H
