# Debian packages with CPack, from the install rules' components (included by CMakeLists.txt):
#
#   component  package           contents
#   lockd      lockd             sbin/lockd, lockd.service, lockd(8), the docs, the example config,
#                                and /etc/rdmalock/lockd.yaml (a conffile); postinst generates
#                                /etc/rdmalock/lockd.key, which that file requires
#   libs       librdmalock       librdmalock.so.0 (the runtime library, SONAME librdmalock.so.0)
#   dev        librdmalock-dev   headers (C++ and C), librdmalock.so, the CMake package, rdmalock.pc,
#                                docs/sdk.md
#   lockctl    lockctl           bin/lockctl, lockctl(1)
#   python     python3-rdmalock  the Python package (lib/python3/dist-packages/rdmalock, py.typed,
#                                its dist-info); Architecture: all, pure Python over librdmalock
#
# Build them (into BUILD/pkg) from a tree configured with -DCMAKE_INSTALL_PREFIX=/usr:
#   cmake --build build --target package
#   cpack --config build/CPackConfig.cmake        (the same, without building first)
# Shared-library dependencies come from dpkg-shlibdeps (package dpkg-dev); the packages depend on
# each other with exact versions. docs/operations.md, "Installing", describes the result.

# GNUInstallDirs chose LIBDIR (lib/<multiarch> only for /usr) and SYSCONFDIR when this tree was
# configured, so a package is only right from a /usr tree. cpack refuses otherwise (a configure
# with another prefix, e.g. for `cmake --install --prefix`, still works).
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_BINARY_DIR}/CPackProjectConfig.cmake)
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  file(WRITE ${CPACK_PROJECT_CONFIG_FILE} "")
else()
  file(WRITE ${CPACK_PROJECT_CONFIG_FILE}
    "message(FATAL_ERROR \"rdmalock packages need a tree configured with -DCMAKE_INSTALL_PREFIX=/usr; "
    "${CMAKE_BINARY_DIR} has ${CMAKE_INSTALL_PREFIX}\")\n")
endif()

# The conffile: config/lockd.yaml (the defaults, documented) with one change, so that the lockd
# the package enables is never open (issue 17 finding 15): auth_key_file names the key postinst
# generates, /etc/rdmalock/lockd.key (root's, mode 0600). Clients without the key get no rkey;
# without the file lockd refuses to start and names it. EXCLUDE_FROM_ALL: only a component install
# (cpack) puts it in /etc; a plain `cmake --install` leaves the admin's /etc alone. DESTDIR staging
# (CPACK_SET_DESTDIR) keeps the absolute path inside the package.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/config/lockd.yaml)
file(READ ${PROJECT_SOURCE_DIR}/config/lockd.yaml _rdmalock_conf)
set(_rdmalock_conf_in "${_rdmalock_conf}")
string(REPLACE
  "# lockd configuration. Every key is optional; the values below are the defaults.\n"
  "# lockd configuration, as the lockd package installs it. Every key is optional; the values below\n# are the defaults, except auth_key_file (below): this lockd requires the key the package generated.\n"
  _rdmalock_conf "${_rdmalock_conf}")
string(REPLACE "\nauth_key_file: \"\"\n"
  "\n# As installed: the key the lockd package's postinst generated (64 hex digits, root's, mode 0600;\n# kept on upgrades and reinstalls, removed on purge). Give clients a copy, or replace it with your\n# own key (docs/operations.md, \"First steps after installing\").\nauth_key_file: /etc/rdmalock/lockd.key\n"
  _rdmalock_conf "${_rdmalock_conf}")
string(FIND "${_rdmalock_conf}" "\nauth_key_file: /etc/rdmalock/lockd.key\n" _rdmalock_has_key)
if(_rdmalock_has_key EQUAL -1 OR _rdmalock_conf STREQUAL _rdmalock_conf_in)
  message(FATAL_ERROR "config/lockd.yaml has no line 'auth_key_file: \"\"' or no first line as "
    "deploy/pkg/packaging.cmake expects: the lockd package's conffile must require a key")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/pkg-conffile/lockd.yaml "${_rdmalock_conf}")
install(FILES ${CMAKE_BINARY_DIR}/pkg-conffile/lockd.yaml DESTINATION /etc/rdmalock COMPONENT lockd
  EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rdmalock)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "rdmalock maintainers <maintainers@users.noreply.a-seed-28609f8a.example>")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/pkg)
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Stripped, as Debian ships binaries (the build tree keeps the debug info).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lockd libs dev lockctl python)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# lockctl needs librdmalock.so.0 from this build: dpkg-shlibdeps finds it here, sees that no
# installed package owns it and leaves it out; the explicit Depends below covers it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# A shlibs file for the package with the shared library (librdmalock), so packages built against it
# get "librdmalock (>= VERSION)" from dpkg-shlibdeps; CPack adds ldconfig to its postinst/postrm.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(_rdmalock_exact "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

set(CPACK_DEBIAN_LOCKD_PACKAGE_NAME lockd)
set(CPACK_DEBIAN_LOCKD_PACKAGE_SECTION net)
set(CPACK_DEBIAN_LOCKD_DESCRIPTION "rdmalock lock server
lockd registers a table of 8-byte lock words with an RDMA NIC and hands
librdmalock clients the keys; clients then acquire and release locks with
one-sided RDMA atomics. Ships the systemd unit lockd.service (enabled; not
started on install, not restarted on upgrade) and /etc/rdmalock/lockd.yaml,
which requires the shared key /etc/rdmalock/lockd.key that the package
generates at install (clients need a copy).")
# procps: /bin/kill, the unit's ExecReload (as openssh-server depends on it for ssh.service); not in
# a minbase system. The shared-library dependencies are appended by dpkg-shlibdeps.
set(CPACK_DEBIAN_LOCKD_PACKAGE_DEPENDS "procps")
# The verbs provider (e.g. rdma_rxe's userspace part) and rdma-core's udev rules and module
# loading: lockd needs them on a real node, but not to be installed or to --check-config.
set(CPACK_DEBIAN_LOCKD_PACKAGE_RECOMMENDS "rdma-core, ibverbs-providers")
set(CPACK_DEBIAN_LOCKD_PACKAGE_SUGGESTS "lockctl")
set(CPACK_DEBIAN_LOCKD_PACKAGE_CONTROL_EXTRA
  ${CMAKE_CURRENT_LIST_DIR}/lockd/conffiles
  ${CMAKE_CURRENT_LIST_DIR}/lockd/postinst
  ${CMAKE_CURRENT_LIST_DIR}/lockd/prerm
  ${CMAKE_CURRENT_LIST_DIR}/lockd/postrm)

set(CPACK_DEBIAN_LIBS_PACKAGE_NAME librdmalock)
set(CPACK_DEBIAN_LIBS_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBS_DESCRIPTION "rdmalock client library (distributed locks over RDMA)
librdmalock.so.0: applications acquire and release rdmalock locks with
one-sided RDMA atomics against a lockd node.")
set(CPACK_DEBIAN_LIBS_PACKAGE_RECOMMENDS "ibverbs-providers")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME librdmalock-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "rdmalock client library: development files
Headers (rdmalock/client.h), librdmalock.so, the CMake package
(find_package(rdmalock CONFIG), target rdmalock::rdmalock) and rdmalock.pc
for pkg-config.")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "librdmalock (= ${_rdmalock_exact})")

set(CPACK_DEBIAN_LOCKCTL_PACKAGE_NAME lockctl)
set(CPACK_DEBIAN_LOCKCTL_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_LOCKCTL_DESCRIPTION "rdmalock admin and scripting tool
lockctl shows a lockd node's status and clients, inspects and force-releases
locks, runs commands under a lock and benchmarks a lock node.")
set(CPACK_DEBIAN_LOCKCTL_PACKAGE_DEPENDS "librdmalock (= ${_rdmalock_exact})")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-rdmalock)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_DESCRIPTION "rdmalock client library: Python 3 binding
The rdmalock module (Client, Cluster, Lock) over librdmalock's C API, with
ctypes: acquire and release rdmalock locks, with the same with-blocks,
fencing tokens and lost callbacks as the C++ SDK. Type hints included.")
# It loads librdmalock.so.0 at run time (ctypes), which dpkg-shlibdeps cannot see: the exact
# version is the one its ctypes declarations were written against.
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, librdmalock (= ${_rdmalock_exact})")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/python3-rdmalock/prerm)

include(CPack)
