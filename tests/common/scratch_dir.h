// A scratch folder per test process for the files a test writes (checkpoints, corpora, vocabularies):
// made on first use under GoogleTest's TempDir() with a unique name, and removed with everything in it
// when the process that made it exits normally, so that a run of the suites leaves nothing behind and
// two test processes never share a path. A forked child's exit leaves the folder to its parent.
#ifndef DST_TESTS_COMMON_SCRATCH_DIR_H
#define DST_TESTS_COMMON_SCRATCH_DIR_H

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace dst_test {

// The folder's path with a trailing '/'. A failure to make it is reported as a test failure, and the
// paths then fall in TempDir() itself (named after the process, as before this helper).
inline const std::string &scratch_dir() {
    struct Folder {
        std::string path;
        pid_t owner = ::getpid();
        bool made = false;
        Folder() {
            std::string tmpl = ::testing::TempDir() + "dst_test_XXXXXX";
            if (::mkdtemp(tmpl.data()) != nullptr) {
                path = tmpl + "/";
                made = true;
            } else {
                ADD_FAILURE() << "could not make a scratch folder under " << ::testing::TempDir() << ": "
                              << std::strerror(errno);
                path = ::testing::TempDir() + "dst_test_" + std::to_string(::getpid()) + "_";
            }
        }
        ~Folder() {
            if (made && ::getpid() == owner) {
                std::error_code ec;
                std::filesystem::remove_all(path, ec);
            }
        }
    };
    static Folder folder;
    return folder.path;
}

// A path in the scratch folder (name may name a file or a folder; nothing is created).
inline std::string scratch_path(const std::string &name) { return scratch_dir() + name; }

}  // namespace dst_test

#endif  // DST_TESTS_COMMON_SCRATCH_DIR_H
